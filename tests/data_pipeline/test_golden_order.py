"""The training stream's batches, bitwise and in order, against digests recorded from the loader
as it was before windows were read ahead: an epoch and a half on 0, 1 and 2 workers per rank, on
1 and 2 ranks, and across a resume mid-window, read from the tar shards and from the packed ids.
The data is written here from seeded ids (no tokenizer), so the digests hold on any machine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from data_pipeline.config import DataConfig
from data_pipeline.loader import TokenBatchStream
from data_pipeline.packed import PackedWriter, packed_name
from data_pipeline.shards import ShardWriter

SHARDS, PER_SHARD, VOCAB = 4, 400, 600


@pytest.fixture(scope="module")
def seeded_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 training shards of 400 pairs of seeded random ids (3-60 tokens a side), 10 % of them
    longer than max_len on one side."""
    out = tmp_path_factory.mktemp("seeded")
    rng = np.random.default_rng(7)
    shards = []
    for s in range(SHARDS):
        name = f"shards/train-{s:06d}.tar"
        (out / "shards").mkdir(exist_ok=True)
        writer = ShardWriter(out / name, "uint16")
        packed = PackedWriter(out / packed_name(name), "uint16", "")  # keys: 7 digits, as here
        for i in range(PER_SHARD):
            n_src, n_tgt = (int(x) for x in rng.integers(3, 61, 2))
            if rng.random() < 0.1:
                n_src = 80  # skipped as too long at max_len 64
            src = [*rng.integers(4, VOCAB, n_src - 1).tolist(), 3]  # ends with EOS
            tgt = rng.integers(4, VOCAB, n_tgt).tolist()
            writer.write(f"{s:02d}{i:05d}", src, tgt, f"src {s} {i}", f"tgt {s} {i}")
            packed.write(s * 100_000 + i, src, tgt)
        sha, size = writer.close()
        packed_sha, packed_size = packed.close()
        shards.append({"name": name, "samples": PER_SHARD, "sha256": sha, "bytes": size,
                       "packed": {"name": packed_name(name), "sha256": packed_sha,
                                  "bytes": packed_size}})  # fmt: skip
    manifest = {
        "version": 1, "src_lang": "en", "tgt_lang": "de", "vocab_size": VOCAB,
        "dtype": "uint16", "max_len": 64,
        "splits": {"train": {"shards": shards, "samples": SHARDS * PER_SHARD}},
    }  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def config(workers: int, read_ahead: int, store: str) -> DataConfig:
    return DataConfig(
        max_tokens=512, max_len=64, shuffle_buffer=150, num_workers=workers, bucket_width=8,
        pad_multiple=8, read_ahead=read_ahead, store=store,
    )  # fmt: skip


def digest(batches: list) -> str:
    h = hashlib.sha256()
    for b in batches:
        for t in (b.src, b.tgt_in, b.tgt_out):
            h.update(str(tuple(t.shape)).encode())
            h.update(t.numpy().tobytes())
        h.update("|".join(b.keys).encode())
        h.update(f"{b.n_src_tokens},{b.n_tgt_tokens}".encode())
    return h.hexdigest()[:16]


def take(stream: TokenBatchStream, n: int) -> list:
    out = []
    for b in stream:
        out.append(b)
        if len(out) == n:
            break
    return out


GOLDEN = {  # recorded from the loader before read-ahead (one window at a time, in the worker)
    (0, 1): {"straight 0": "6edabcdb36c8c936", "resumed 0": "dd9501c6841ecf29"},
    (2, 1): {"straight 0": "796aa1ef16b2b4b9", "resumed 0": "f81623f8b6db0e58"},
    (1, 2): {
        "straight 0": "b58c6f5a96344670", "resumed 0": "a3084937bdb88611",
        "straight 1": "27ef77bd39b0d3c5", "resumed 1": "18a01fd9546ff6e6",
    },
    (2, 2): {
        "straight 0": "ad31325fffb54603", "resumed 0": "eafd7a8a9f7f4943",
        "straight 1": "24001860296805bb", "resumed 1": "d2c30557eb852187",
    },
}  # fmt: skip


CASES = [(0, 1, 1, "tar"), (2, 1, 1, "tar"), (1, 2, 1, "tar"), (2, 2, 1, "tar"),
         (0, 1, 0, "tar"), (2, 2, 0, "tar"), (0, 1, 1, "packed"), (1, 2, 1, "packed"),
         (2, 2, 1, "packed"), (2, 2, 0, "packed")]  # fmt: skip


@pytest.mark.parametrize(("workers", "world", "read_ahead", "store"), CASES)
def test_an_epoch_and_a_half_and_a_resume_give_the_recorded_batches(
    seeded_data: Path, workers: int, world: int, read_ahead: int, store: str
) -> None:
    """(workers per rank, ranks, windows read ahead, what is read): the same batches whatever
    the read-ahead, from the tars as from the packed ids."""
    got = {}
    cfg = config(workers, read_ahead, store)
    for rank in range(world):
        stream = TokenBatchStream(seeded_data, "train", cfg, rank=rank, world_size=world)
        straight = take(stream, 150 // world)
        got[f"straight {rank}"] = digest(straight)
        first = TokenBatchStream(seeded_data, "train", cfg, rank=rank, world_size=world)
        take(first, 37 // world)
        state = first.state_dict()
        first.close()
        resumed = TokenBatchStream(seeded_data, "train", cfg, rank=rank, world_size=world)
        resumed.load_state_dict(state)
        rest = take(resumed, 150 // world - 37 // world)
        got[f"resumed {rank}"] = digest(rest)
        assert digest(straight[37 // world :]) == got[f"resumed {rank}"]
        stream.close()
        resumed.close()
    assert got == GOLDEN[(workers, world)]
