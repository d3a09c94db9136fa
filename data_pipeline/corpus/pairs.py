"""The record every source parser yields."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RawPair:
    """One English-German pair as a parser found it.

    `source` names where it came from (``ding/example``, ``ddtp/summary`` ...; the part before the
    slash is the source family reported in corpus.json). `group` ties pairs that must land in the
    same split (one dictionary line, one Debian package); pairs that share a string are tied too,
    by the splitter.
    """

    en: str
    de: str
    source: str
    group: str

    @property
    def family(self) -> str:
        """The source family: the part of `source` before the first slash."""
        return self.source.split("/", 1)[0]
