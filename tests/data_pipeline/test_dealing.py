"""Dealing units to producer slots: blocks balance unequal shards; every sample once per epoch;
states saved before blocks keep whole-shard units; two ranks reading in lockstep see each sample
of an epoch once, whatever the shard sizes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from data_pipeline.dealing import Dealing, unit_key
from data_pipeline.loader import TokenBatchStream, read_manifest
from data_pipeline.prepare import prepare
from data_pipeline.shards import iter_shard
from tests.data_pipeline.conftest import MAX_LEN, VOCAB, data_cfg


def samples_of(d: Dealing, slot: int, epoch: int) -> list[tuple[int, int]]:
    """(shard, raw index) of every sample slot `slot` reads in `epoch`."""
    out = []
    for u in d.slot_plan(slot, epoch):
        span = d.span(u)
        out += [(u[0], span.first + k * span.stride) for k in range(span.count)]
    return out


@pytest.mark.parametrize("n_slots", [1, 2, 3, 4])
@pytest.mark.parametrize("sizes", [(1000, 90), (500, 500, 500, 7), (37,), (250, 251)])
def test_every_sample_once_and_slots_balanced(sizes: tuple[int, ...], n_slots: int) -> None:
    d = Dealing(sizes, n_slots, seed=3, shuffle=True, block=100)
    per_slot = [samples_of(d, s, epoch=2) for s in range(n_slots)]
    every = [x for xs in per_slot for x in xs]
    assert sorted(every) == [(s, i) for s, n in enumerate(sizes) for i in range(n)]
    counts = [len(xs) for xs in per_slot]
    if len(sizes) >= n_slots:  # blocks: slots differ by at most one block
        assert max(counts) - min(counts) <= 100, counts
    else:  # parts: every shard split by sample index among all slots
        assert max(counts) - min(counts) <= len(sizes), counts


def test_unit_keys_and_spans() -> None:
    d = Dealing((250, 80), 2, seed=1, shuffle=False, block=100)
    units = d.epoch_units(0)
    assert [unit_key(u) for u in units] == ["0#0", "0#1", "0#2", "1"]
    assert [d.span(u).count for u in units] == [100, 100, 50, 80]
    assert d.span(units[2]).first == 200
    parts = Dealing((250,), 4, seed=1, shuffle=False, block=100)
    assert [unit_key(u) for u in parts.epoch_units(0)] == ["0:0/4", "0:1/4", "0:2/4", "0:3/4"]
    assert parts.span(parts.epoch_units(0)[1]).count == len(range(1, 250, 4))


def test_state_before_blocks_deals_whole_shards() -> None:
    d = Dealing((1000, 90), 2, seed=1, shuffle=False, block=None)
    assert [unit_key(u) for u in d.epoch_units(0)] == ["0", "1"]
    assert [len(samples_of(d, s, 0)) for s in range(2)] == [1000, 90]


def test_shards_of_unequal_size_are_not_oversampled(corpus_dir: Path, tmp_path: Path) -> None:
    """One long and one short train shard, two ranks reading one batch each per step: within
    an epoch's worth of samples nearly every sample is new (with whole-shard units the rank
    dealt the short shard cycled through it ~5 times meanwhile: ~35% repeats)."""
    data = tmp_path / "data"
    prepare(corpus_dir, data, vocab_size=VOCAB, shard_samples=2500, workers=1,
            max_len=MAX_LEN, log=lambda _: None)  # fmt: skip
    cfg = data_cfg(max_tokens=512, shuffle_buffer=100, num_workers=0)
    streams = [TokenBatchStream(data, "train", cfg, rank=r, world_size=2) for r in range(2)]
    epoch = streams[0].manifest["splits"]["train"]["samples"]
    seen: Counter[str] = Counter()
    its = [iter(s) for s in streams]
    while sum(seen.values()) < 0.95 * epoch:
        for it in its:
            seen.update(next(it).keys)
    repeats = sum(seen.values()) - len(seen)
    assert repeats <= 0.03 * epoch, f"{repeats} repeated samples in {sum(seen.values())}"


def test_state_saved_before_blocks_resumes_with_whole_shards(prepared: Path) -> None:
    """A version-2 state (no block size) goes on dealing whole shards, exactly resumably."""
    cfg = data_cfg(num_workers=0)

    def stream() -> TokenBatchStream:
        return TokenBatchStream(prepared, "train", cfg, rank=0, world_size=2, epochs=1)

    old = stream().state_dict()
    old["version"] = 2
    del old["block"], old["shard_samples"]
    a = stream()
    a.load_state_dict(old)
    assert a.state_dict()["block"] is None
    keys = [k for b in a for k in b.keys]
    shards = read_shard_keys(prepared)
    mine = {i for i, ks in enumerate(shards) if ks & set(keys)}
    assert set(keys) == set().union(*(shards[i] for i in mine))  # whole shards, nothing else
    b, c = stream(), stream()
    b.load_state_dict(old)
    it = iter(b)
    head = [k for _ in range(5) for k in next(it).keys]
    c.load_state_dict(b.state_dict())
    assert head + [k for batch in c for k in batch.keys] == keys


def read_shard_keys(data: Path) -> list[set[str]]:
    shards = read_manifest(data)["splits"]["train"]["shards"]
    return [{s.key for s in iter_shard(data / sh["name"])} for sh in shards]
