"""The synthetic mapped-reversal corpus: determinism, disjoint splits, learnable structure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_pipeline.corpus import write_synthetic
from data_pipeline.corpus.synthetic import make_lexicon, translate

FILES = [f"{s}.{lang}" for s in ("train", "valid", "test") for lang in ("en", "de")]


def read(d: Path, name: str) -> list[str]:
    return (d / name).read_text(encoding="utf-8").splitlines()


def test_same_seed_gives_identical_bytes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_synthetic(a, n_train=300, n_valid=30, n_test=30, seed=3)
    write_synthetic(b, n_train=300, n_valid=30, n_test=30, seed=3)
    write_synthetic(c, n_train=300, n_valid=30, n_test=30, seed=4)
    for name in [*FILES, "corpus.json"]:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "train.en").read_bytes() != (c / "train.en").read_bytes()


def test_counts_lengths_and_disjoint_splits(tmp_path: Path) -> None:
    stats = write_synthetic(tmp_path, n_train=500, n_valid=50, n_test=40, min_len=3, max_len=7)
    assert stats["splits"] == {"train": 500, "valid": 50, "test": 40}
    assert json.loads((tmp_path / "corpus.json").read_text())["splits"] == stats["splits"]
    sources = {s: read(tmp_path, f"{s}.en") for s in ("train", "valid", "test")}
    for s, lines in sources.items():
        assert len(lines) == len(read(tmp_path, f"{s}.de")) == stats["splits"][s]
        assert all(3 <= len(line.split()) <= 7 for line in lines)
    assert not set(sources["test"]) & set(sources["train"])
    assert not set(sources["valid"]) & set(sources["train"])
    assert not set(sources["valid"]) & set(sources["test"])


def test_target_is_mapped_reversal_through_a_bijection(tmp_path: Path) -> None:
    stats = write_synthetic(tmp_path, n_train=200, n_valid=10, n_test=10, vocab=30)
    lexicon = make_lexicon(30, 1)
    assert stats["lexicon"] == lexicon
    assert len(lexicon) == 30 and len(set(lexicon.values())) == 30  # bijection
    assert not set(lexicon) & set(lexicon.values())  # disjoint vocabularies
    for en, de in zip(read(tmp_path, "train.en"), read(tmp_path, "train.de"), strict=True):
        src, tgt = en.split(), de.split()
        assert len(src) == len(tgt)
        assert tgt == [lexicon[w] for w in reversed(src)]
        assert translate(en, lexicon) == de
    words = {w for line in read(tmp_path, "train.en") for w in line.split()}
    assert words <= set(lexicon)


def test_rejects_impossible_requests(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_synthetic(tmp_path, n_train=100, vocab=2, min_len=1, max_len=2)
    with pytest.raises(ValueError):
        write_synthetic(tmp_path, vocab=1)
