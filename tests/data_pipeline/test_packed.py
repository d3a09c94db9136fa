"""The packed token store (data_pipeline/packed.py): written by `prepare` beside every shard and
listed in the manifest; the training stream reads it and gives the same batches as from the
tars, resumes across the two, answers a damaged file by reading the tar, and skips and counts
malformed samples as the tar reader does."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from data_pipeline.batching import Batch
from data_pipeline.config import DataConfig, resolved_store
from data_pipeline.loader import TokenBatchStream, read_manifest
from data_pipeline.packed import MAGIC, PackedError, PackedShard, packed_name
from data_pipeline.shards import decode_sample, iter_shard
from data_pipeline.verify import verify
from launch.config import ConfigError, check_data_dir, load_config
from tests.data_pipeline.conftest import VOCAB, data_cfg, prepare_test_corpus


def epoch(data_dir: Path, cfg: DataConfig, rank: int = 0, world: int = 1) -> list[Batch]:
    return list(TokenBatchStream(data_dir, "train", cfg, rank=rank, world_size=world, epochs=1))


def same(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.src, y.src) and torch.equal(x.tgt_in, y.tgt_in)
        and torch.equal(x.tgt_out, y.tgt_out) and x.keys == y.keys
        and (x.n_src_tokens, x.n_tgt_tokens) == (y.n_src_tokens, y.n_tgt_tokens)
        for x, y in zip(a, b, strict=True)
    )  # fmt: skip


def train_shards(data_dir: Path) -> list[dict]:
    return read_manifest(data_dir)["splits"]["train"]["shards"]


def test_prepare_writes_packed_ids_of_every_shard(prepared: Path) -> None:
    """Every shard of every split has its packed file, as the manifest says, holding the tar's
    samples in the tar's order: keys, source and target ids."""
    manifest = read_manifest(prepared)
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            assert entry["packed"]["name"] == packed_name(entry["name"])
            assert (prepared / entry["packed"]["name"]).stat().st_size == entry["packed"]["bytes"]
            shard = PackedShard(prepared, entry, "uint16", VOCAB)
            ((_, n, samples, bad, long),) = shard.windows(0, 1, entry["samples"], 0, 10**6, None)
            assert (n, bad, long) == (entry["samples"], 0, 0)
            raws = list(iter_shard(prepared / entry["name"]))
            assert [s.key for s in samples] == [r.key for r in raws]
            for s, r in zip(samples, raws, strict=True):
                src, tgt = decode_sample(r, "uint16", VOCAB)
                assert np.array_equal(s.src, src) and np.array_equal(s.tgt, tgt)
    assert verify(prepared, log=lambda _: None) == []


@pytest.mark.parametrize(("world", "workers"), [(1, 0), (2, 2)])
def test_the_same_batches_as_from_the_tars(prepared: Path, world: int, workers: int) -> None:
    for rank in range(world):
        tar = epoch(prepared, data_cfg(num_workers=workers, store="tar"), rank, world)
        packed = epoch(prepared, data_cfg(num_workers=workers, store="packed"), rank, world)
        auto = epoch(prepared, data_cfg(num_workers=workers), rank, world)
        assert len(tar) > 20 and same(tar, packed) and same(tar, auto)


def test_a_resume_crosses_between_the_stores(prepared: Path) -> None:
    """A position saved reading the tars resumes on the packed ids, and back: one stream."""
    tar_cfg, packed_cfg = data_cfg(store="tar"), data_cfg(store="packed")
    whole = epoch(prepared, tar_cfg)
    first = TokenBatchStream(prepared, "train", tar_cfg, epochs=1)
    head = [b for _, b in zip(range(30), first, strict=False)]
    second = TokenBatchStream(prepared, "train", packed_cfg, epochs=1)
    second.load_state_dict(first.state_dict())
    middle = [b for _, b in zip(range(30), second, strict=False)]
    third = TokenBatchStream(prepared, "train", tar_cfg, epochs=1)
    third.load_state_dict(second.state_dict())
    assert same(whole, head + middle + list(third))


def test_batches_with_text_read_the_tars(prepared: Path) -> None:
    stream = TokenBatchStream(prepared, "valid", data_cfg(store="packed"), shuffle=False, epochs=1)
    assert stream._ctx.store == "tar"
    assert all(t for b in stream for t in b.src_text)


def damaged_copy(prepared: Path, tmp_path: Path, fn: object) -> Path:
    import shutil

    out = tmp_path / "data"
    shutil.copytree(prepared, out)
    entry = train_shards(out)[2]
    path = out / entry["packed"]["name"]
    fn(path, bytearray(path.read_bytes()))  # type: ignore[operator]
    return out


def truncate(path: Path, raw: bytearray) -> None:
    path.write_bytes(raw[: len(raw) - 7])


def break_index(path: Path, raw: bytearray) -> None:
    """The second sample's offset moved (same size: only the structure check sees it)."""
    start = len(MAGIC) + 4 + int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 4], "little")
    start += -start % 64
    raw[start + 32 : start + 40] = (5).to_bytes(8, "little")
    path.write_bytes(bytes(raw))


def bad_magic(path: Path, raw: bytearray) -> None:
    raw[0:5] = b"XXXXX"
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", [truncate, break_index, bad_magic])
def test_a_damaged_packed_file_is_named_and_its_tar_read(
    prepared: Path, tmp_path: Path, damage: object, caplog: pytest.LogCaptureFixture
) -> None:
    data = damaged_copy(prepared, tmp_path, damage)
    name = train_shards(data)[2]["name"]
    with caplog.at_level(logging.WARNING, logger="data_pipeline.loader"):
        got = epoch(data, data_cfg(num_workers=0, store="packed"))
    assert same(got, epoch(prepared, data_cfg(num_workers=0, store="tar")))
    (line,) = [r.getMessage() for r in caplog.records if "reading" in r.getMessage()]
    assert line.startswith(f"data train: {packed_name(name)}: ")
    assert line.endswith(f"reading {name} instead")
    assert packed_name(name) in verify(data, log=lambda _: None)


def test_a_malformed_sample_is_skipped_and_counted(prepared: Path, tmp_path: Path) -> None:
    """An id beyond the vocabulary in one sample: that sample alone is left out, counted as
    corrupt; the rest of the shard is read."""

    def beyond_vocab(path: Path, raw: bytearray) -> None:
        raw[-2:] = (VOCAB + 5).to_bytes(2, "little")  # the last id of the last sample
        path.write_bytes(bytes(raw))

    data = damaged_copy(prepared, tmp_path, beyond_vocab)
    stream = TokenBatchStream(data, "train", data_cfg(num_workers=0, store="packed"), epochs=1)
    keys = [k for b in stream for k in b.keys]
    clean = TokenBatchStream(prepared, "train", data_cfg(num_workers=0), epochs=1)
    clean_keys = [k for b in clean for k in b.keys]
    last = list(iter_shard(data / train_shards(data)[2]["name"]))[-1].key
    assert sorted(keys) == sorted(k for k in clean_keys if k != last)
    assert stream.stats()["samples_skipped_corrupt"] == 1
    assert clean.stats()["samples_skipped_corrupt"] == 0


def test_a_header_that_does_not_match_the_manifest_is_refused(prepared: Path) -> None:
    entry = train_shards(prepared)[0]
    with pytest.raises(PackedError, match="does not match the manifest"):
        PackedShard(prepared, {**entry, "samples": 1}, "uint16", VOCAB)


def without_packed(prepared: Path, tmp_path: Path) -> Path:
    """A copy of `prepared` as written before the packed store: no .ids files, no entries."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    for path in (data / "shards").glob("*.ids"):
        path.unlink()
    manifest = json.loads((data / "manifest.json").read_text())
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            entry.pop("packed")
    (data / "manifest.json").write_text(json.dumps(manifest))
    return data


def test_rerun_writes_missing_packed_ids_from_the_tars(
    prepared: Path, corpus_dir: Path, tmp_path: Path
) -> None:
    """A data dir without its packed files: read from the tars (auto), refused for `packed`;
    `prepare` on it again writes them from the verified tars, byte for byte, re-encoding
    nothing, and the manifest is the one of a fresh prepare."""
    data = without_packed(prepared, tmp_path)
    assert resolved_store("auto", train_shards(data), text=False) == "tar"
    with pytest.raises(ValueError, match="re-run `paperscale prepare`"):
        resolved_store("packed", train_shards(data), text=False)
    lines: list[str] = []
    prepare_test_corpus(corpus_dir, data, log=lines.append)
    assert any("train:" in line and "(6 verified" in line for line in lines), lines
    assert read_manifest(data) == read_manifest(prepared)
    for path in (prepared / "shards").glob("*.ids"):
        assert (data / "shards" / path.name).read_bytes() == path.read_bytes()


def test_store_packed_without_packed_ids_is_a_config_error(prepared: Path, tmp_path: Path) -> None:
    data = without_packed(prepared, tmp_path)
    job = load_config(None, [f"data.dir={data}", "data.store=packed"])
    with pytest.raises(ConfigError, match=r"^data.store: packed, but .* no packed ids"):
        check_data_dir(job)
    check_data_dir(load_config(None, [f"data.dir={data}", "data.store=auto"]))


def test_packed_names_sit_beside_their_shards() -> None:
    for shard in (
        "shards/train-000001.tar",
        "shards/train-000001.tar.gz",
        "shards/train-000001.tgz",
    ):
        assert packed_name(shard) == "shards/train-000001.ids"


def test_a_header_missing_a_field_is_a_damaged_file(prepared: Path, tmp_path: Path) -> None:
    def no_tokens(path: Path, raw: bytearray) -> None:
        length = int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 4], "little")
        head = raw[len(MAGIC) + 4 : len(MAGIC) + 4 + length].replace(b'"tokens"', b'"tokenz"')
        raw[len(MAGIC) + 4 : len(MAGIC) + 4 + length] = head
        path.write_bytes(bytes(raw))

    data = damaged_copy(prepared, tmp_path, no_tokens)
    with pytest.raises(PackedError, match="unreadable header"):
        PackedShard(data, train_shards(data)[2], "uint16", VOCAB)
