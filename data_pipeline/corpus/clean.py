"""Normalise, filter and deduplicate raw pairs into a clean parallel corpus.

Rules (each rejected pair is counted under its reason, reported in corpus.json):

* ``control_chars``: a tab, newline or other control character inside a side (line-based files
  could not hold it);
* ``empty``; ``markup``: HTML/XML tags or entities; ``format_only``: fewer than half of the
  characters are letters (format strings, paths, numbers);
* ``identical``: German equals English (untranslated, names, codes);
* ``too_short`` / ``too_long``: fewer than `min_words` / more than `max_words` words on a side;
* ``length_ratio``: character lengths differ by more than `max_ratio` (with a small floor),
  a sign of a misaligned or partial translation;
* ``duplicate_pair``: the exact pair was kept already; ``duplicate_source``: the English side
  was kept already with another German side (one target per source, the first one wins).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from data_pipeline.corpus.pairs import RawPair

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_INVISIBLE = re.compile(r"[\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff\u00ad]")
_MARKUP = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>|&(?:[a-zA-Z]+|#\d+|#x[0-9a-f]+);")


@dataclass(frozen=True)
class FilterRules:
    """Thresholds of the filter (defaults match the project's documented corpus)."""

    min_words: int = 3
    max_words: int = 60
    max_ratio: float = 2.5
    ratio_floor: int = 10  # characters added to both lengths so short pairs are not over-judged


def normalise(text: str) -> str:
    """NFC, invisible characters removed, every run of whitespace one space, ends stripped."""
    text = unicodedata.normalize("NFC", text)
    text = _INVISIBLE.sub("", text)
    return " ".join(text.split())


def reject_reason(en_raw: str, de_raw: str, rules: FilterRules = FilterRules()) -> str | None:
    """Why a pair (before normalisation) is rejected, or None if it is kept."""
    if _CONTROL.search(en_raw.strip()) or _CONTROL.search(de_raw.strip()):
        return "control_chars"
    en, de = normalise(en_raw), normalise(de_raw)
    if not en or not de:
        return "empty"
    if _MARKUP.search(en) or _MARKUP.search(de):
        return "markup"
    for side in (en, de):
        chars = side.replace(" ", "")
        if sum(c.isalpha() for c in chars) * 2 < len(chars):
            return "format_only"
    if en.casefold() == de.casefold():
        return "identical"
    en_words, de_words = len(en.split()), len(de.split())
    if min(en_words, de_words) < rules.min_words:
        return "too_short"
    if max(en_words, de_words) > rules.max_words:
        return "too_long"
    a, b = len(en) + rules.ratio_floor, len(de) + rules.ratio_floor
    if max(a, b) > rules.max_ratio * min(a, b):
        return "length_ratio"
    return None


def clean_pairs(
    pairs: Iterable[RawPair], rules: FilterRules = FilterRules()
) -> tuple[list[RawPair], Counter[str]]:
    """Normalised kept pairs in input order and the count of rejected pairs per reason."""
    kept: list[RawPair] = []
    filtered: Counter[str] = Counter()
    seen_pairs: set[tuple[str, str]] = set()
    seen_sources: set[str] = set()
    for pair in pairs:
        reason = reject_reason(pair.en, pair.de, rules)
        if reason:
            filtered[reason] += 1
            continue
        en, de = normalise(pair.en), normalise(pair.de)
        if (en, de) in seen_pairs:
            filtered["duplicate_pair"] += 1
            continue
        seen_pairs.add((en, de))
        if en in seen_sources:
            filtered["duplicate_source"] += 1
            continue
        seen_sources.add(en)
        kept.append(replace(pair, en=en, de=de))
    return kept, filtered
