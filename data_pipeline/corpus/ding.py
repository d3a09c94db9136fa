"""Parser for the Ding German-English dictionary (Debian package ``trans-de-en``).

Format (``usr/share/trans/de-en``): UTF-8, ``#`` comment lines, one entry per line as
``DE :: EN``. `` | `` separates sub-entries that correspond by position (headword, plural,
examples ...), ``;`` separates synonyms. ``{m}``, ``[coll.]``, ``<alt>`` and ``(gloss)`` are
annotations. We keep pairs of multi-word phrases and the example sentences; the one-word
headwords are dropped later by the length filter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from data_pipeline.corpus.pairs import RawPair

DING_PATH = Path("usr/share/trans/de-en")  # inside the unpacked .deb

_OPEN = "([{<"
_CLOSE = ")]}>"
_ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>|\([^()]*\)")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?])")
_SENTENCE = re.compile(r"^[\"'„“‚]?[A-ZÄÖÜ0-9].*[.!?][\"'“”‘’]?$")


def split_top(text: str, sep: str) -> list[str]:
    """Split `text` on `sep` where it is not inside brackets (``{hid; hidden}`` stays whole)."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def strip_annotations(text: str) -> str:
    """Remove ``{..}``, ``[..]``, ``<..>`` and ``(..)`` (innermost first) and tidy the spaces."""
    prev = None
    while prev != text:
        prev = text
        text = _ANNOTATION.sub(" ", text)
    text = " ".join(text.split())
    return _SPACE_BEFORE_PUNCT.sub(r"\1", text).strip(" ;,")


def is_sentence(text: str) -> bool:
    """Whether `text` looks like a full sentence: capital first, sentence punctuation last."""
    return bool(_SENTENCE.match(text)) and len(text.split()) >= 2


def parse_line(line: str) -> list[tuple[str, str]] | None:
    """The (English, German) pairs of one dictionary line; None if the line cannot be aligned.

    Sub-entries are aligned by position only when both sides have the same number of them;
    within a sub-entry every German synonym is paired with every English one (the cleaner later
    keeps one target per source).
    """
    line = line.strip()
    if not line or line.startswith("#") or line.count(" :: ") != 1:
        return None
    de_side, en_side = line.split(" :: ")
    de_parts = split_top(de_side, "|")
    en_parts = split_top(en_side, "|")
    if len(de_parts) != len(en_parts):
        return None
    out: list[tuple[str, str]] = []
    for de_part, en_part in zip(de_parts, en_parts, strict=True):
        de_syns = [s for s in (strip_annotations(x) for x in split_top(de_part, ";")) if s]
        en_syns = [s for s in (strip_annotations(x) for x in split_top(en_part, ";")) if s]
        for de in de_syns:
            for en in en_syns:
                out.append((en, de))
    return out


def parse_lines(lines: Iterable[str], origin: str = "ding") -> Iterator[RawPair]:
    """Pairs of all lines; each line is one group, sentences are tagged ``ding/example``."""
    for lineno, line in enumerate(lines, 1):
        pairs = parse_line(line)
        if not pairs:
            continue
        for en, de in pairs:
            kind = "example" if is_sentence(en) and is_sentence(de) else "phrase"
            yield RawPair(en=en, de=de, source=f"ding/{kind}", group=f"{origin}:{lineno}")


def unaligned_lines(lines: Iterable[str]) -> int:
    """How many entry lines could not be aligned (different sub-entry counts per side)."""
    n = 0
    for line in lines:
        s = line.strip()
        if s and not s.startswith("#") and parse_line(s) is None:
            n += 1
    return n


def read_ding(path: Path) -> list[RawPair]:
    """All pairs of a Ding file (``.../usr/share/trans/de-en``)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return list(parse_lines(f))
