"""The examples `evaluate --show` picks and how it prints them; scoring's figures."""

from __future__ import annotations

from launch.scoring import format_examples, pick_examples, score


def test_examples_prefer_whole_sentences_spread_over_the_split() -> None:
    sources = ["a b"] * 10 + ["one two three four five six"] * 10 + ["x"] * 10
    picked = pick_examples(sources, 5)
    assert len(picked) == 5 and picked == sorted(set(picked))
    assert all(10 <= i < 20 for i in picked)
    assert pick_examples(sources, 5) == picked  # deterministic


def test_examples_fall_back_to_any_sentence_and_handle_small_splits() -> None:
    assert pick_examples(["a", "b", "c"], 5) == [0, 1, 2]
    assert pick_examples(["a"] * 9, 3) == [0, 3, 6]
    assert pick_examples([], 5) == [] and pick_examples(["a"], 0) == []


def test_format_shows_source_reference_and_hypothesis() -> None:
    text = format_examples([1], ["s0", "s1"], ["r0", "r1"], ["h0", "h1"])
    assert text.splitlines() == ["[1]", "  source     s1", "  reference  r1", "  hypothesis h1"]


def test_score_of_perfect_and_empty_translations() -> None:
    refs = ["the cat sat on the mat today", "a dog barked at the mailman"]
    perfect, lines = score(refs, refs)
    assert perfect["bleu"] == 100.0 and perfect["sentences"] == 2
    assert "nrefs:1" in perfect["bleu_signature"] and len(lines) == 2
    empty, _ = score(["", ""], refs)
    assert empty["bleu"] == 0.0
