"""Debian package descriptions and their German translations (DDTP, ``Translation-*`` indexes).

The indexes are deb822 paragraphs with ``Package``, ``Description-md5`` (the md5 of the English
description, so it identifies the English text a translation was made from) and
``Description-en`` / ``Description-de``. A description is a one-line summary followed by
continuation lines; `` .`` separates paragraphs. Summaries are paired directly; long
descriptions are paired paragraph by paragraph, item by item, and sentence by sentence, and a
paragraph is used only where both sides split into the same number of sentences.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from data_pipeline.corpus.pairs import RawPair

_BULLET = re.compile(r"^(?:[*+\-o•]|\d+[.)])\s+")
_ABBREVIATIONS = frozenset(
    [
        "e.g",
        "i.e",
        "etc",
        "vs",
        "cf",
        "approx",
        "incl",
        "esp",
        "resp",
        "no",
        "nr",
        "dr",
        "mr",
        "mrs",
        "ms",
        "st",
        "jr",
        "sr",
        "prof",
        "inc",
        "ltd",
        "co",
        "corp",
        "z.b",
        "d.h",
        "u.a",
        "bzw",
        "ca",
        "usw",
        "evtl",
        "ggf",
        "inkl",
        "sog",
        "vgl",
        "bspw",
        "z.t",
        "u.ä",
        "o.ä",
        "s.o",
        "s.u",
        "u.v.m",
    ]
)
_SENT_BOUNDARY = re.compile(r"(?<=[.!?])[\"'”“)]?\s+(?=[\"'„“(]?[A-ZÄÖÜ0-9])")


def parse_deb822(text: str) -> Iterator[dict[str, str]]:
    """Paragraphs of a deb822 file as dicts; continuation lines keep their newline and indent."""
    para: dict[str, str] = {}
    key: str | None = None
    for line in text.splitlines():
        if not line.strip():
            if para:
                yield para
            para, key = {}, None
        elif line[0] in " \t":
            if key is not None:
                para[key] += "\n" + line
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip()
            para[key] = value.strip()
    if para:
        yield para


def descriptions(paragraphs: Iterable[dict[str, str]], lang: str) -> dict[str, tuple[str, str]]:
    """``Description-md5`` -> (Package, ``Description-<lang>`` text) for one language."""
    out: dict[str, tuple[str, str]] = {}
    field = f"Description-{lang}"
    for para in paragraphs:
        md5, text, pkg = para.get("Description-md5"), para.get(field), para.get("Package", "")
        if md5 and text is not None:
            out.setdefault(md5, (pkg, text))
    return out


def split_description(text: str) -> tuple[str, list[list[str]]]:
    """(summary, paragraphs) of a description; each paragraph is a list of items.

    An item is running text (wrapped lines joined) or one bullet / preformatted line, so that
    lists are aligned item by item.
    """
    lines = text.split("\n")
    summary = " ".join(lines[0].split())
    paragraphs: list[list[str]] = []
    items: list[str] = []
    current: list[str] = []

    def flush_item() -> None:
        if current:
            items.append(" ".join(" ".join(current).split()))
            current.clear()

    for raw in lines[1:]:
        body = raw[1:] if raw.startswith(" ") else raw
        if body.strip() == ".":
            flush_item()
            if items:
                paragraphs.append(items)
            items = []
            continue
        stripped = body.strip()
        if body.startswith((" ", "\t")) or _BULLET.match(stripped):
            flush_item()  # a preformatted or bullet line starts its own item
            stripped = _BULLET.sub("", stripped)
        current.append(stripped)
        if body.startswith((" ", "\t")):
            flush_item()
    flush_item()
    if items:
        paragraphs.append(items)
    return summary, paragraphs


def _protected(token: str) -> bool:
    """Whether a sentence may not end after `token` (an abbreviation or an initial)."""
    word = token.strip("\"'(„“").rstrip(".").lower()
    if not word:
        return True
    if len(word) == 1 and word.isalpha():
        return True  # "z. B.", "A. D.", initials
    return word in _ABBREVIATIONS or "." in word  # "e.g.", "A.D.", "u.a."


def split_sentences(text: str) -> list[str]:
    """Split running text into sentences, not after abbreviations, initials or version dots."""
    out: list[str] = []
    start = 0
    for m in _SENT_BOUNDARY.finditer(text):
        before = text[start : m.start()].split()
        if before and _protected(before[-1]):
            continue
        out.append(text[start : m.start()].strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return [s for s in out if s]


def pair_description(en: str, de: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(summary pairs, sentence pairs) of one English description and its translation."""
    en_summary, en_paras = split_description(en)
    de_summary, de_paras = split_description(de)
    summaries = [(en_summary, de_summary)] if en_summary and de_summary else []
    sentences: list[tuple[str, str]] = []
    if len(en_paras) != len(de_paras):
        return summaries, sentences
    for en_items, de_items in zip(en_paras, de_paras, strict=True):
        if len(en_items) != len(de_items):
            continue
        for en_item, de_item in zip(en_items, de_items, strict=True):
            en_sents, de_sents = split_sentences(en_item), split_sentences(de_item)
            if len(en_sents) == len(de_sents):
                sentences.extend(zip(en_sents, de_sents, strict=True))
    return summaries, sentences


def pair_translations(
    en_paragraphs: Iterable[dict[str, str]], de_paragraphs: Iterable[dict[str, str]]
) -> Iterator[RawPair]:
    """Pairs from matching English and German descriptions (same ``Description-md5``).

    Every pair of one package is in group ``ddtp:<Package>``.
    """
    english = descriptions(en_paragraphs, "en")
    for para in de_paragraphs:
        md5, de_text = para.get("Description-md5"), para.get("Description-de")
        if not md5 or de_text is None or md5 not in english:
            continue
        package = para.get("Package") or english[md5][0]
        summaries, sentences = pair_description(english[md5][1], de_text)
        group = f"ddtp:{package}"
        for en, de in summaries:
            yield RawPair(en=en, de=de, source="ddtp/summary", group=group)
        for en, de in sentences:
            yield RawPair(en=en, de=de, source="ddtp/sentence", group=group)
