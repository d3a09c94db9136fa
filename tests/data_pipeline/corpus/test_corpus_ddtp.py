"""DDTP: deb822 Translation-en/-de paragraphs, description splitting and pairing."""

from __future__ import annotations

from data_pipeline.corpus import ddtp

TRANSLATION_EN = """\
Package: 0ad
Description-md5: d943033bedada21853d2ae54a2578a7b
Description-en: Real-time strategy game of ancient warfare
 0 A.D. is a free, open-source, cross-platform real-time strategy game of
 ancient warfare. It is ambitious, e.g. it has current 3D graphics.
 .
 Features:
  * multiplayer games over the network
  * a scenario editor
 .
 This package has two sentences. Here is the second one.

Package: foo
Description-md5: 00000000000000000000000000000001
Description-en: frobnicates the bar
 Foo frobnicates the bar.

Package: untranslated
Description-md5: 00000000000000000000000000000002
Description-en: nobody translated this one
 Sad.
"""

TRANSLATION_DE = """\
Package: 0ad
Description-md5: d943033bedada21853d2ae54a2578a7b
Description-de: Echtzeit-Strategiespiel über antike Kriegsführung
 0 A.D. ist ein freies, quelloffenes, plattformübergreifendes
 Echtzeit-Strategiespiel über antike Kriegsführung. Es ist ambitioniert,
 z. B. hat es aktuelle 3D-Grafiken.
 .
 Funktionen:
  * Mehrspielerpartien über das Netzwerk
  * ein Szenarioeditor
 .
 Dieses Paket hat nur einen Satz, der beide englischen Sätze enthält.

Package: foo
Description-md5: 00000000000000000000000000000001
Description-de: frobniziert die Bar
 Foo frobniziert die Bar.
"""


def test_parse_deb822_keeps_continuation_lines() -> None:
    paras = list(ddtp.parse_deb822(TRANSLATION_EN))
    assert [p["Package"] for p in paras] == ["0ad", "foo", "untranslated"]
    assert paras[0]["Description-en"].startswith("Real-time strategy game of ancient warfare\n")
    assert "\n .\n" in paras[0]["Description-en"]


def test_split_sentences_respects_abbreviations() -> None:
    assert ddtp.split_sentences("It is ambitious, e.g. it has 3D. It works.") == [
        "It is ambitious, e.g. it has 3D.",
        "It works.",
    ]
    assert ddtp.split_sentences("Es ist gut, z. B. Grafik. 0 A.D. ist frei.") == [
        "Es ist gut, z. B. Grafik.",
        "0 A.D. ist frei.",
    ]


def test_split_description_paragraphs_and_items() -> None:
    summary, paras = ddtp.split_description(
        next(iter(ddtp.parse_deb822(TRANSLATION_EN)))["Description-en"]
    )
    assert summary == "Real-time strategy game of ancient warfare"
    assert len(paras) == 3
    assert paras[1] == ["Features:", "multiplayer games over the network", "a scenario editor"]


def test_pair_translations_on_md5_with_sentence_counts() -> None:
    pairs = list(
        ddtp.pair_translations(ddtp.parse_deb822(TRANSLATION_EN), ddtp.parse_deb822(TRANSLATION_DE))
    )
    got = {(p.en, p.de): p for p in pairs}
    summary = got[
        (
            "Real-time strategy game of ancient warfare",
            "Echtzeit-Strategiespiel über antike Kriegsführung",
        )
    ]
    assert summary.source == "ddtp/summary" and summary.group == "ddtp:0ad"
    assert ("a scenario editor", "ein Szenarioeditor") in got
    assert (
        "It is ambitious, e.g. it has current 3D graphics.",
        "Es ist ambitioniert, z. B. hat es aktuelle 3D-Grafiken.",
    ) in got
    assert got[("Foo frobnicates the bar.", "Foo frobniziert die Bar.")].source == "ddtp/sentence"
    # two English sentences against one German sentence: that paragraph is not used
    assert not any(p.en.startswith("This package has two") for p in pairs)
    assert not any("nobody" in p.en for p in pairs)  # no German translation
