"""bench.data end to end on the small test corpus: every section's rows with sane figures, and
batching v2 pads no more than v1 on the same windows."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import data as bench
from bench.data import PADDING_ROWS, Batching, padding_stats, read_lengths
from tests.data_pipeline.conftest import MAX_LEN


def test_padding_split_and_v2_not_worse(prepared: Path) -> None:
    lens = read_lengths(prepared, MAX_LEN)
    for pm, bw in ((8, 8), (1, 1)):
        v1, v2, v3 = (
            padding_stats(lens, Batching(version, pm, bm, bw, window=500), max_tokens=512)
            for version, bm in ((1, 1), (2, 1), (3, 8))
        )
        for r in (v1, v2, v3):
            assert r["padding"] == pytest.approx(r["rounding"] + r["mismatch"])
            assert 0 < r["fill"] <= 1 and r["batches"] > 10
            assert (r["rounding"] == 0) == (pm == 1)
        assert v2["mismatch"] < v1["mismatch"]
        # Cutting to multiples of 8 rows aligns (nearly) every batch and costs little padding.
        assert v3["rows_multiple"] > 0.9 > v2["rows_multiple"] or pm == 8
        assert v3["padding"] < v2["padding"] + 0.02


def test_bench_measures_every_section(corpus_dir: Path, tmp_path: Path) -> None:
    kw = {"vocab_size": 300, "seconds": 0.5, "pairs": [4000], "spm_sentences": 5000,
          "loader_epochs": 1}  # fmt: skip
    rows = bench.measure(tmp_path, corpus=str(corpus_dir), **kw)
    value = {r["figure"]: r["value"] for r in rows}
    assert value["shard bytes per sample, tar.gz"] < value["shard bytes per sample, tar"] / 5
    loader = [r for r in rows if r["figure"].startswith("loader, ")]
    cases = [(k, s, w) for k in ("tar", "tar.gz") for s in ("tar", "packed") for w in (0, 1)]
    assert [(r["shards"], r["store"], r["workers"]) for r in loader] == cases
    assert all(r["value"] > 0 for r in loader)  # tokens/s
    assert len([r for r in rows if r["figure"].startswith("padding, ")]) == len(PADDING_ROWS)
    (prep,) = [r for r in rows if r["figure"].endswith("pairs, shard stage")]
    assert prep["pairs"] == 4000 and prep["value"] > 0  # pairs/s
