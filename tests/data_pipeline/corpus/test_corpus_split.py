"""The group split: nothing of valid/test reappears in train."""

from __future__ import annotations

from pathlib import Path

from data_pipeline.corpus.pairs import RawPair
from data_pipeline.corpus.split import group_pairs, match_key, split_pairs, write_split


def crafted() -> list[RawPair]:
    pairs = []
    for i in range(300):
        pairs.append(RawPair(f"english sentence {i}", f"deutscher Satz {i}", "x", f"g{i}"))
    # chains through shared strings: A-B share English, B-C share German, C-D share a group
    pairs.append(RawPair("shared english", "erste Übersetzung", "x", "c1"))
    pairs.append(RawPair("Shared English!", "zweite Übersetzung", "x", "c2"))  # same match key
    pairs.append(RawPair("another english", "zweite Übersetzung", "x", "c3"))
    pairs.append(RawPair("unrelated english", "ganz anders", "x", "c3"))
    return pairs


def test_groups_join_shared_sources_targets_and_declared_groups() -> None:
    pairs = crafted()
    groups = group_pairs(pairs)
    chain = next(g for g in groups if 300 in g)
    assert sorted(chain) == [300, 301, 302, 303]
    assert len(groups) == 301
    assert match_key("Shared English!") == match_key("shared  english")


def test_no_valid_or_test_string_occurs_in_train() -> None:
    pairs = crafted()
    for seed in range(5):
        splits = split_pairs(pairs, valid_size=40, test_size=40, seed=seed, max_heldout_group=4)
        assert len(splits["valid"]) == 40 and len(splits["test"]) == 40
        assert sum(len(v) for v in splits.values()) == len(pairs)
        train_en = {match_key(p.en) for p in splits["train"]}
        train_de = {match_key(p.de) for p in splits["train"]}
        for held in ("valid", "test"):
            for p in splits[held]:
                assert match_key(p.en) not in train_en and match_key(p.de) not in train_de
        valid_keys = {match_key(p.en) for p in splits["valid"]}
        assert not valid_keys & {match_key(p.en) for p in splits["test"]}


def test_split_is_deterministic_and_seed_dependent() -> None:
    pairs = crafted()
    a = split_pairs(pairs, valid_size=20, test_size=20, seed=1)
    b = split_pairs(pairs, valid_size=20, test_size=20, seed=1)
    c = split_pairs(pairs, valid_size=20, test_size=20, seed=2)
    assert a == b
    assert a["valid"] != c["valid"]


def test_large_groups_stay_in_train() -> None:
    big = [RawPair(f"english {i}", f"deutsch {i}", "x", "one-package") for i in range(50)]
    splits = split_pairs(big, valid_size=10, test_size=10, seed=1, max_heldout_group=16)
    assert len(splits["train"]) == 50


def test_write_split_is_line_aligned(tmp_path: Path) -> None:
    pairs = [
        RawPair("one two three", "eins zwei drei", "x", "g"),
        RawPair("a b c", "d e f", "x", "h"),
    ]
    write_split(tmp_path, "train", pairs)
    assert (tmp_path / "train.en").read_text(encoding="utf-8") == "one two three\na b c\n"
    assert (tmp_path / "train.de").read_text(encoding="utf-8") == "eins zwei drei\nd e f\n"
