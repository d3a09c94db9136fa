"""bench.data end to end on the small test corpus: every table is printed with sane figures,
and batching v2 pads no more than v1 on the same windows."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import data as bench
from bench.data_padding import PADDING_ROWS, padding_stats, read_lengths
from tests.data_pipeline.conftest import MAX_LEN


def test_padding_split_and_v2_not_worse(prepared: Path) -> None:
    lens = read_lengths(prepared, MAX_LEN)
    for pm, bw in ((8, 8), (1, 1)):
        kw = {"window": 500, "max_tokens": 512, "pad_multiple": pm, "bucket_width": bw}
        v1 = padding_stats(lens, version=1, **kw)
        v2 = padding_stats(lens, version=2, **kw)
        v3 = padding_stats(lens, version=3, batch_multiple=8, **kw)
        for r in (v1, v2, v3):
            assert r["padding"] == pytest.approx(r["rounding"] + r["mismatch"])
            assert 0 < r["fill"] <= 1 and r["batches"] > 10
            assert (r["rounding"] == 0) == (pm == 1)
        assert v2["mismatch"] < v1["mismatch"]
        # Cutting to multiples of 8 rows aligns (nearly) every batch and costs little padding.
        assert v3["rows_multiple"] > 0.9 > v2["rows_multiple"] or pm == 8
        assert v3["padding"] < v2["padding"] + 0.02


def _table(out: str, title: str) -> list[list[str]]:
    """Data rows (after the header line) of the section whose title starts with ``title``."""
    section = out.split(f"## {title}", 1)[1].split("##", 1)[0]
    lines = [line.split() for line in section.splitlines()[2:] if line.strip()]
    return [row for row in lines if not row[0].startswith("#")]


def test_bench_runs_and_prints_every_table(
    corpus_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--corpus", str(corpus_dir), "--work", str(tmp_path), "--vocab-size", "300"]
    args += ["--seconds", "0.5", "--pairs", "4000", "--spm-sentences", "5000"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    shards = {row[0]: row for row in _table(out, "shards")}
    assert float(shards["tar.gz"][2]) < float(shards["tar"][2]) / 5  # bytes per sample
    loader = _table(out, "loader")
    assert [(r[0], r[1]) for r in loader] == [("tar", "0"), ("tar", "1"), ("tar.gz", "0"),
                                             ("tar.gz", "1")]  # fmt: skip
    assert all(float(r[2]) > 0 for r in loader)  # tokens/s
    assert len(_table(out, "padding")) == len(PADDING_ROWS)
    (prep,) = _table(out, "prepare")
    assert prep[0] == "4000" and float(prep[4]) > 0  # pairs/s
