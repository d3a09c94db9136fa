"""Normalisation, the filter rules and deduplication."""

from __future__ import annotations

from data_pipeline.corpus.clean import FilterRules, clean_pairs, normalise, reject_reason
from data_pipeline.corpus.pairs import RawPair


def test_normalise_whitespace_and_invisibles() -> None:
    assert normalise("  a\u00a0 b\u200b c  ") == "a b c"
    assert normalise("Ka\u0308se") == "Käse"  # NFC


def test_reject_reasons() -> None:
    ok = ("the cat sat on the mat", "die Katze saß auf der Matte")
    assert reject_reason(*ok) is None
    assert reject_reason("the cat\tsat down", "die Katze saß") == "control_chars"
    assert reject_reason("the cat\nsat down", "die Katze saß") == "control_chars"
    assert reject_reason("<b>bold</b> text here", "<b>fett</b> Text hier") == "markup"
    assert reject_reason("{0}: {1} / {2} (3)", "{0} - {1} / {2} [3]") == "format_only"
    assert reject_reason("Debian GNU Linux", "Debian GNU Linux") == "identical"
    assert reject_reason("a fine house", "ein Haus") == "too_short"
    assert reject_reason(" ".join(["word"] * 61), " ".join(["Wort"] * 61)) == "too_long"
    assert reject_reason("yes it is", "ja es ist " + "sehr " * 20) == "length_ratio"
    assert reject_reason("a b c", "x y z", FilterRules(min_words=4)) == "too_short"


def test_clean_pairs_dedups_and_keeps_one_target_per_source() -> None:
    raw = [
        RawPair("the old house", "das alte Haus", "ding/phrase", "1"),
        RawPair("the  old house", "das alte Haus", "ding/phrase", "2"),  # same after normalising
        RawPair("the old house", "das alte Gebäude", "ding/phrase", "3"),  # second target
        RawPair("an old building", "das alte Gebäude", "ding/phrase", "4"),
        RawPair("house", "Haus", "ding/phrase", "5"),
    ]
    kept, filtered = clean_pairs(raw)
    assert [(p.en, p.de) for p in kept] == [
        ("the old house", "das alte Haus"),
        ("an old building", "das alte Gebäude"),
    ]
    assert filtered == {"duplicate_pair": 1, "duplicate_source": 1, "too_short": 1}
