"""prepare: manifest matches the files, shards are webdataset-readable, re-runs verify and
resume, gz/TSV inputs, cleaning counts, one-line errors for bad input."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

from data_pipeline.manifest import read_manifest
from data_pipeline.prepare import PROGRESS_NAME, prepare
from data_pipeline.shards import sha256_file
from data_pipeline.tokenizer import BOS_ID, EOS_ID, Tokenizer
from tests.data_pipeline.conftest import MAX_LEN, SHARD_SAMPLES, VOCAB, prepare_test_corpus
from tests.data_pipeline.corpus_gen import make_corpus

ROOT = Path(__file__).resolve().parents[2]


def _prep(corpus: Path, out: Path, **kw: object) -> tuple[dict, list[str]]:
    lines: list[str] = []
    args = {"vocab_size": 300, "shard_samples": 200, "workers": 2, "max_len": 64}
    args.update(kw)
    m = prepare(corpus, out, log=lines.append, **args)  # type: ignore[arg-type]
    return m, lines


def test_manifest_matches_files(prepared: Path, corpus_dir: Path) -> None:
    m = read_manifest(prepared)
    assert m["version"] == 1 and m["src_lang"] == "en" and m["tgt_lang"] == "de"
    assert m["vocab_size"] == VOCAB and m["dtype"] == "uint16"
    assert set(m["splits"]) == {"train", "valid", "test"}
    assert json.loads((prepared / "manifest.json").read_text()) == m
    tok = Tokenizer(prepared / "spm.model")
    for split, entry in m["splits"].items():
        n = src_tok = tgt_tok = 0
        for i, shard in enumerate(entry["shards"]):
            assert shard["name"] == f"shards/{split}-{i:06d}.tar"
            path = prepared / shard["name"]
            assert sha256_file(path) == shard["sha256"]
            assert path.stat().st_size == shard["bytes"]
            count = s_tok = t_tok = 0
            for sample in wds.WebDataset(str(path), shardshuffle=False):
                assert sample["__key__"].startswith(f"{split}-{i:06d}-")
                src = np.frombuffer(sample["src.ids"], dtype="<u2")
                tgt = np.frombuffer(sample["tgt.ids"], dtype="<u2")
                assert src[-1] == EOS_ID and EOS_ID not in src[:-1]
                assert BOS_ID not in tgt and EOS_ID not in tgt
                assert tok.encode([sample["tgt.txt"].decode()])[0] == tgt.tolist()
                count, s_tok, t_tok = count + 1, s_tok + len(src), t_tok + len(tgt)
            assert (count, s_tok, t_tok) == (
                shard["samples"],
                shard["src_tokens"],
                shard["tgt_tokens"],
            )
            n, src_tok, tgt_tok = n + count, src_tok + s_tok, tgt_tok + t_tok
        assert (n, src_tok, tgt_tok) == (entry["samples"], entry["src_tokens"], entry["tgt_tokens"])
    # valid/test keep every line (no cleaning), in order, text verbatim.
    valid_lines = (corpus_dir / "valid.en").read_text().splitlines()
    assert m["splits"]["valid"]["samples"] == len(valid_lines)
    first = next(
        iter(wds.WebDataset(str(prepared / "shards/valid-000000.tar"), shardshuffle=False))
    )
    assert first["src.txt"].decode() == valid_lines[0]
    # train: long pairs were dropped and counted.
    clean = m["splits"]["train"]["cleaning"]
    assert clean["lines"] == 3000 and clean["too_long"] > 0
    assert m["splits"]["train"]["samples"] == 3000 - sum(
        clean[k] for k in ("empty", "too_long", "ratio", "duplicate")
    )
    assert len(m["splits"]["train"]["shards"]) == -(-3000 // SHARD_SAMPLES)
    assert m["max_len"] == MAX_LEN


def test_rerun_verifies_and_redoes_only_damaged(prepared_copy: Path, corpus_dir: Path) -> None:
    out = prepared_copy
    before = read_manifest(out)
    victim = out / before["splits"]["train"]["shards"][2]["name"]
    victim.write_bytes(victim.read_bytes()[:1000])  # an interrupted/damaged shard
    (out / before["splits"]["test"]["shards"][0]["name"]).unlink()  # never written
    (out / "manifest.json").unlink()  # interrupted before the manifest
    untouched = out / before["splits"]["train"]["shards"][0]["name"]
    mtime = untouched.stat().st_mtime_ns
    lines: list[str] = []
    after = prepare_test_corpus(corpus_dir, out, lines.append)
    assert after == before
    assert untouched.stat().st_mtime_ns == mtime
    assert any("reusing" in line for line in lines)
    assert any("train:" in line and "(5 verified" in line for line in lines)
    assert any("test:" in line and "(0 verified" in line for line in lines)
    assert sha256_file(victim) == before["splits"]["train"]["shards"][2]["sha256"]


def test_changed_settings_start_over(tmp_path: Path, corpus_dir: Path) -> None:
    out = tmp_path / "out"
    m1, _ = _prep(corpus_dir, out)
    m2, lines = _prep(corpus_dir, out, shard_samples=400)
    assert any("starting" in line and "over" in line for line in lines)
    assert len(m2["splits"]["train"]["shards"]) < len(m1["splits"]["train"]["shards"])
    assert sorted(p.name for p in (out / "shards").iterdir()) == sorted(
        Path(name).name
        for sp in m2["splits"].values()
        for s in sp["shards"]
        for name in (s["name"], s["packed"]["name"])
    )  # the first run's shards and packed ids all gone
    assert json.loads((out / PROGRESS_NAME).read_text().splitlines()[0])["shard_samples"] == 400


def test_gz_and_tsv_inputs_give_identical_shards(tmp_path: Path, corpus_dir: Path) -> None:
    gz_dir, tsv_dir = tmp_path / "gz", tmp_path / "tsv"
    gz_dir.mkdir()
    tsv_dir.mkdir()
    for split in ("train", "valid", "test"):
        en = (corpus_dir / f"{split}.en").read_text().splitlines()
        de = (corpus_dir / f"{split}.de").read_text().splitlines()
        for lang in ("en", "de"):
            (gz_dir / f"{split}.{lang}.gz").write_bytes(
                gzip.compress((corpus_dir / f"{split}.{lang}").read_bytes())
            )
        body = "".join(f"{a}\t{b}\n" for a, b in zip(en, de, strict=True))
        name = f"{split}.tsv.gz" if split == "train" else f"{split}.tsv"
        data = gzip.compress(body.encode()) if split == "train" else body.encode()
        (tsv_dir / name).write_bytes(data)
    plain, _ = _prep(corpus_dir, tmp_path / "o1")
    gz, _ = _prep(gz_dir, tmp_path / "o2")
    tsv, _ = _prep(tsv_dir, tmp_path / "o3", workers=0)
    # Same pairs in the same order -> same spm pieces -> byte-identical shards.  (spm.model
    # itself embeds the path of its training file, so its sha256 differs.)
    for m in (plain, gz, tsv):
        m.pop("spm_sha256")
    assert plain == gz == tsv


def test_cleaning_counts(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "c", train=600, valid=20, test=20)
    en = (corpus / "train.en").read_text().splitlines()
    de = (corpus / "train.de").read_text().splitlines()
    en += ["", "Kalo.", en[0], "Ka " * 200, "Ka lo."]
    de += ["Olak.", "", de[0], "Ak.", "Ak " * 40]
    (corpus / "train.en").write_text("\n".join(en) + "\n")
    (corpus / "train.de").write_text("\n".join(de) + "\n")
    m, lines = _prep(corpus, tmp_path / "o", dedup=True, max_len=128, max_ratio=3.0)
    clean = m["splits"]["train"]["cleaning"]
    assert clean["lines"] == 605
    assert clean["empty"] == 2
    assert clean["duplicate"] >= 1
    assert clean["too_long"] >= 1
    assert clean["ratio"] >= 1
    assert m["splits"]["train"]["samples"] == 605 - sum(
        clean[k] for k in ("empty", "too_long", "ratio", "duplicate")
    )
    assert any("dropped" in line for line in lines)


def _bad(tmp_path: Path, files: dict[str, bytes]) -> str:
    corpus = tmp_path / "bad"
    corpus.mkdir()
    for name, data in files.items():
        (corpus / name).write_bytes(data)
    with pytest.raises(ValueError) as exc:
        prepare(corpus, tmp_path / "o", vocab_size=50, workers=0, log=lambda _: None)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_bad_input_lengths_differ(tmp_path: Path) -> None:
    msg = _bad(tmp_path, {"train.en": b"a b\nc d\ne f\n", "train.de": b"x y\nz w\n"})
    assert "train.de has 2 lines" in msg and "train.en" in msg


def test_bad_input_invalid_utf8(tmp_path: Path) -> None:
    msg = _bad(tmp_path, {"train.en": b"a b\nc d\n", "train.de": b"x y\nz \xff w\n"})
    assert "train.de:2: invalid UTF-8" in msg


def test_bad_input_empty_file(tmp_path: Path) -> None:
    msg = _bad(tmp_path, {"train.en": b"", "train.de": b""})
    assert "train.en: empty input file" in msg


def test_bad_input_missing_side_and_tsv_columns(tmp_path: Path) -> None:
    msg = _bad(tmp_path, {"train.en": b"a\n"})
    assert "train.en" in msg and "train.de" in msg and "missing" in msg
    shutil.rmtree(tmp_path / "bad")
    msg = _bad(tmp_path, {"train.tsv": b"a\tb\nc d e\n"})
    assert "train.tsv:2: expected at least 2 tab-separated columns (source, target), found 1" in msg
    shutil.rmtree(tmp_path / "bad")
    msg = _bad(tmp_path, {"valid.en": b"a\n", "valid.de": b"b\n"})
    assert "no training data" in msg


def test_vocab_too_large_through_prepare(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "c", train=50, valid=5, test=5)
    with pytest.raises(ValueError, match=r"too small for vocab_size=20000.*at most \d+"):
        prepare(corpus, tmp_path / "o", vocab_size=20000, workers=0, log=lambda _: None)


def test_shards_are_plain_tars_with_fixed_metadata(prepared: Path) -> None:
    with tarfile.open(prepared / "shards/valid-000000.tar") as tar:
        members = tar.getmembers()
    assert [m.name.split(".", 1)[1] for m in members[:4]] == [
        "src.ids",
        "tgt.ids",
        "src.txt",
        "tgt.txt",
    ]
    assert all(m.mtime == 0 for m in members)


def test_verify_names_damaged_shards(prepared_copy: Path) -> None:
    from data_pipeline.prepare import verify

    assert verify(prepared_copy, log=lambda _: None) == []
    m = read_manifest(prepared_copy)
    a = prepared_copy / m["splits"]["train"]["shards"][0]["name"]
    data = bytearray(a.read_bytes())
    data[700] ^= 0xFF  # same size, different bytes
    a.write_bytes(bytes(data))
    (prepared_copy / m["splits"]["test"]["shards"][0]["name"]).unlink()
    lines: list[str] = []
    assert verify(prepared_copy, log=lines.append) == [
        m["splits"]["train"]["shards"][0]["name"],
        m["splits"]["test"]["shards"][0]["name"],
    ]
    assert "sha256 mismatch" in lines[0] and "missing" in lines[1]


def test_progress_bar_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = make_corpus(tmp_path / "c", train=300, valid=10, test=10)
    prepare(corpus, tmp_path / "o", vocab_size=200, workers=0, progress=True, log=lambda _: None)
    err = capsys.readouterr().err
    assert "train" in err and "100%" in err


def test_shard_reader_agrees_with_webdataset_and_tarfile_formats(
    prepared: Path, tmp_path: Path
) -> None:
    from data_pipeline.shards import iter_shard

    path = prepared / "shards/train-000000.tar"
    ours = [(s.key, s.parts) for s in iter_shard(path)]
    theirs = [
        (s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
        for s in wds.WebDataset(str(path), shardshuffle=False)
    ]
    assert ours == theirs
    # Seeking: samples before `skip_before` come without data, the rest unchanged.
    skipped = list(iter_shard(path, skip_before=5))
    assert [s.key for s in skipped] == [k for k, _ in ours]
    assert all(not s.parts for s in skipped[:5]) and skipped[5].parts == ours[5][1]
    # Tars written by other tools: pax and GNU long names, directories.
    long_key = "x" * 120
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        other = tmp_path / f"other-{fmt}.tar"
        with tarfile.open(other, "w", format=fmt) as tar:
            d = tarfile.TarInfo("dir")
            d.type = tarfile.DIRTYPE
            tar.addfile(d)
            for ext, data in (("src.ids", b"\x05\x00\x03\x00"), ("tgt.ids", b"\x05\x00")):
                info = tarfile.TarInfo(f"dir/{long_key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        got = list(iter_shard(other))
        assert [(s.key, sorted(s.parts)) for s in got] == [(long_key, ["src.ids", "tgt.ids"])]


def test_lost_tokenizer_redoes_every_shard(prepared_copy: Path, corpus_dir: Path) -> None:
    before = read_manifest(prepared_copy)
    (prepared_copy / "spm.model").unlink()
    lines: list[str] = []
    after = prepare_test_corpus(corpus_dir, prepared_copy, lines.append)
    assert any("training sentencepiece" in line for line in lines)
    assert any("train:" in line and "(0 verified" in line for line in lines)
    # Training is deterministic (same sample, same seed): same pieces, same shards.
    assert [s["sha256"] for s in after["splits"]["train"]["shards"]] == [
        s["sha256"] for s in before["splits"]["train"]["shards"]
    ]


def test_encoding_in_slices_and_tokenizer_in_a_child(
    tmp_path: Path, corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers encode a shard in slices (same bytes as whole), and with workers > 0 the
    sentencepiece sample and training run in a child process (their memory is not kept)."""
    import os

    import data_pipeline.encode as encode
    import data_pipeline.spm_step as spm_step

    pids = tmp_path / "pids"
    real = spm_step.train_sentencepiece

    def spy(*args: object, **kw: object) -> Path:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(spm_step, "train_sentencepiece", spy)
    whole, _ = _prep(corpus_dir, tmp_path / "a", workers=0)
    monkeypatch.setattr(encode, "ENCODE_BATCH", 7)
    sliced, lines = _prep(corpus_dir, tmp_path / "b", workers=2)
    shas = [[s["sha256"] for s in m["splits"]["train"]["shards"]] for m in (whole, sliced)]
    assert shas[0] == shas[1]
    inline, child = (int(p) for p in pids.read_text().split())
    assert inline == os.getpid() and child != os.getpid()  # workers=0: inline; else a child
    assert any("sentencepiece trained on" in line for line in lines)


def test_prepare_runs_without_torch(tmp_path: Path, corpus_dir: Path) -> None:
    """`paperscale prepare` (sentencepiece, shards, packed ids) never imports torch: ~2-3 s of
    CPU at every start on a small machine, in the command and its encoding processes."""
    import subprocess
    import sys

    code = (
        "import sys; from launch.cli import main; code = main(); "
        "print('torch' in sys.modules); sys.exit(code)"
    )
    args = [str(corpus_dir), str(tmp_path / "out"), "--vocab-size", "300", "--workers", "2"]
    proc = subprocess.run(
        [sys.executable, "-c", code, "prepare", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "manifest.json").exists()
    assert proc.stdout.splitlines()[-1] == "False", proc.stdout[-2000:]
