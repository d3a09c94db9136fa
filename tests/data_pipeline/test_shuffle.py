"""prepare's global shuffle (two-pass, on disk, seeded) and TSV inputs with extra columns."""

from __future__ import annotations

from pathlib import Path

from data_pipeline.manifest import read_manifest
from data_pipeline.prepare import prepare
from data_pipeline.shards import iter_shard
from data_pipeline.shuffle import buckets_for, shuffled

PAIRS = [(f"source {i}", f"ziel {i}\tmit tab") for i in range(5000)]


def test_a_seeded_permutation_through_many_buckets(tmp_path: Path) -> None:
    work = tmp_path / "work"
    assert buckets_for(10_000, bucket_bytes=1000) == 10
    a = list(shuffled(iter(PAIRS), work, seed=1, expected_bytes=10**5, bucket_bytes=4096))
    assert not work.exists()  # buckets removed
    assert sorted(a) == sorted(PAIRS) and a != PAIRS
    assert a == list(shuffled(iter(PAIRS), work, seed=1, expected_bytes=10**5, bucket_bytes=4096))
    assert a != list(shuffled(iter(PAIRS), work, seed=2, expected_bytes=10**5, bucket_bytes=4096))
    # Well mixed: the first tenth of the output draws from every tenth of the input (50 each
    # expected, binomial sd 6.7; in input order it would be 500 from the first).
    head = [int(src.split()[1]) // 500 for src, _ in a[:500]]
    assert all(30 <= head.count(d) <= 70 for d in range(10)), [head.count(d) for d in range(10)]


def test_an_early_close_removes_the_buckets(tmp_path: Path) -> None:
    work = tmp_path / "work"
    it = shuffled(iter(PAIRS), work, seed=1, expected_bytes=10**5, bucket_bytes=4096)
    next(it)
    assert work.is_dir()
    it.close()
    assert not work.exists()


def _train_sources(data: Path) -> list[str]:
    shards = read_manifest(data)["splits"]["train"]["shards"]
    return [s.parts["src.txt"].decode() for sh in shards for s in iter_shard(data / sh["name"])]


def test_prepare_shuffles_train_only_and_reads_wide_tsv(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [f"the word {i} here\tdas wort {i} hier\t0.9{i}\tsource-{i // 100}" for i in range(400)]
    (corpus / "train.tsv").write_text("\n".join(rows) + "\n")
    (corpus / "valid.tsv").write_text("\n".join(rows[:50]) + "\n")
    lines: list[str] = []
    kw = {"vocab_size": 60, "shard_samples": 150, "workers": 0, "log": lines.append}
    prepare(corpus, tmp_path / "shuffled", **kw)  # type: ignore[arg-type]
    notes = [x for x in lines if "tab-separated columns" in x]
    assert len(notes) == 2 and "train.tsv has 4 tab-separated columns" in notes[0]
    assert "using the first two as source and target" in notes[0]
    assert any("globally shuffled" in x for x in lines)
    in_order = [r.split("\t")[0] for r in rows]
    got = _train_sources(tmp_path / "shuffled")
    assert sorted(got) == sorted(in_order) and got != in_order
    prepare(corpus, tmp_path / "ordered", shuffle=False, **kw)  # type: ignore[arg-type]
    assert _train_sources(tmp_path / "ordered") == in_order
    m = read_manifest(tmp_path / "shuffled")
    valid = m["splits"]["valid"]["shards"][0]["name"]
    srcs = [s.parts["src.txt"].decode() for s in iter_shard(tmp_path / "shuffled" / valid)]
    assert srcs == in_order[:50]  # evaluation splits keep their order
