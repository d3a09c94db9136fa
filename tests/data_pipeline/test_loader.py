"""TokenBatchStream: budget and padding, coverage across ranks, exact resume (same and other
world size), damaged shards, manifest errors."""

from __future__ import annotations

import gc
import io
import json
import logging
import os
import pickle
import tarfile
import time
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from data_pipeline.loader import Batch, TokenBatchStream, read_manifest
from data_pipeline.shards import ShardReadError, iter_shard
from data_pipeline.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tests.data_pipeline.conftest import data_cfg


def all_keys(data_dir: Path, split: str) -> list[str]:
    m = read_manifest(data_dir)
    return [s.key for sh in m["splits"][split]["shards"] for s in iter_shard(data_dir / sh["name"])]


def run(stream: TokenBatchStream, limit: int | None = None) -> list[Batch]:
    out = []
    for b in stream:
        out.append(b)
        if limit is not None and len(out) == limit:
            break
    return out


def same(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.src, y.src)
        and torch.equal(x.tgt_in, y.tgt_in)
        and torch.equal(x.tgt_out, y.tgt_out)
        and x.keys == y.keys
        for x, y in zip(a, b, strict=True)
    )


def padding(batches: list[Batch]) -> float:
    real = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches)
    return 1 - real / sum(b.src.numel() + b.tgt_out.numel() for b in batches)


def src_lens_of(b: Batch) -> list[int]:
    return (b.src != PAD_ID).sum(1).tolist()


def tgt_lens_of(b: Batch) -> list[int]:
    return (b.tgt_out != PAD_ID).sum(1).tolist()


def unsorted_padding(lens: list[tuple[int, int]], max_tokens: int, pm: int) -> float:
    """Padding of a greedy token-budget cut of ``lens`` in a random order (no length sorting)."""
    order = torch.randperm(len(lens), generator=torch.Generator().manual_seed(0)).tolist()
    real = padded = 0
    cur: list[tuple[int, int]] = []

    def close() -> None:
        nonlocal real, padded
        s = -(-max(n for n, _ in cur) // pm) * pm
        t = -(-max(m for _, m in cur) // pm) * pm
        padded += len(cur) * (s + t)
        real += sum(n + m for n, m in cur)

    for i in order:
        nxt = [*cur, lens[i]]
        width = max(-(-max(max(n, m) for n, m in nxt) // pm) * pm, pm)
        if cur and len(nxt) * width > max_tokens:
            close()
            cur = []
        cur.append(lens[i])
    close()
    return 1 - real / padded


def test_budget_padding_and_conventions(prepared: Path) -> None:
    cfg = data_cfg(max_tokens=512, shuffle_buffer=500, num_workers=0)
    batches = run(TokenBatchStream(prepared, "train", cfg, epochs=1))
    for b in batches:
        bsz, s = b.src.shape  # (B, S)
        t = b.tgt_in.shape[1]  # (B, T)
        assert b.tgt_out.shape == (bsz, t)
        assert s % 8 == 0 and t % 8 == 0
        assert bsz * max(s, t) <= cfg.max_tokens
        assert b.src.dtype == torch.int64
        assert (b.tgt_in[:, 0] == BOS_ID).all()
        # tgt_in shifted left == tgt_out without its EOS
        lens = (b.tgt_out != PAD_ID).sum(1)
        for row, n in enumerate(lens.tolist()):
            assert b.tgt_out[row, n - 1] == EOS_ID
            assert torch.equal(b.tgt_in[row, 1:n], b.tgt_out[row, : n - 1])
        src_lens = (b.src != PAD_ID).sum(1)
        assert all(b.src[r, n - 1] == EOS_ID for r, n in enumerate(src_lens.tolist()))
        assert b.n_src_tokens == int(src_lens.sum())
        assert b.n_tgt_tokens == int(lens.sum())
        assert len(b.keys) == bsz and b.src_text == b.tgt_text == []  # training: ids only
    # Length sorting keeps padding low: rounding to 8 alone costs ~15% at these short lengths
    # (the floor: every row rounded up on its own); the same rows cut in random order (no
    # sorting) waste over half.
    lens = [(n, m) for b in batches for n, m in zip(src_lens_of(b), tgt_lens_of(b), strict=True)]
    floor = sum(-n % 8 + -m % 8 for n, m in lens) / sum(
        b.src.numel() + b.tgt_out.numel() for b in batches
    )
    baseline = unsorted_padding(lens, cfg.max_tokens, 8)
    assert padding(batches) < 0.25
    assert padding(batches) - floor < 0.06  # what the cut itself adds
    assert padding(batches) < 0.5 * baseline
    assert sum(len(b) for b in batches) == read_manifest(prepared)["splits"]["train"]["samples"]


def test_text_travels_only_where_asked(prepared: Path) -> None:
    """Validation batches carry their text (BLEU reads it); training batches ids and keys only,
    unless a stream asks for text; the ids are the same either way."""
    cfg = data_cfg(num_workers=0)
    valid = run(TokenBatchStream(prepared, "valid", cfg, shuffle=False), 1)[0]
    assert len(valid.src_text) == len(valid.tgt_text) == len(valid) and all(valid.tgt_text)
    plain = run(TokenBatchStream(prepared, "train", cfg), 3)
    with_text = run(TokenBatchStream(prepared, "train", cfg, text=True), 3)
    assert same(plain, with_text) and all(b.src_text == [] for b in plain)
    assert all(len(b.src_text) == len(b) and all(b.src_text) for b in with_text)


def boundary_waits(
    data: Path, read_ahead: int, monkeypatch: pytest.MonkeyPatch, per_batch_s: float
) -> list[float]:
    """Seconds the consumer waited for the first batch of windows 3-9, with a reader that
    sleeps 0.2 s per window (the fault seam) and a consumer busy `per_batch_s` a batch."""

    monkeypatch.setenv("PAPERSCALE_FAULT_SLOW_WINDOW_S", "0.2")
    cfg = data_cfg(num_workers=0, shuffle_buffer=150, read_ahead=read_ahead)
    stream = TokenBatchStream(data, "train", cfg, epochs=1)
    batches, waits, windows = iter(stream), [], []
    while True:
        t0 = time.perf_counter()
        if next(batches, None) is None:
            break
        wait = time.perf_counter() - t0
        pos = stream.state_dict()["workers"][0]
        where = (pos["epoch"], pos["unit_index"], pos["window_start"])
        if not windows or windows[-1] != where:
            windows.append(where)
            waits.append(wait)
            if len(windows) > 8:
                break
        time.sleep(per_batch_s)  # the device's work
    stream.close()
    return waits[2:]


def test_the_next_window_is_read_while_the_current_one_is_handed_out(
    prepared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow reader (0.2 s a window) and a consumer that spends ~0.5 s on a window: read one
    window ahead, the consumer never waits at a window boundary for the reader; reading each
    window when its turn comes, it waits the reader's 0.2 s at every one."""
    ahead = boundary_waits(prepared, 1, monkeypatch, 0.05)
    inline = boundary_waits(prepared, 0, monkeypatch, 0.05)
    assert len(ahead) == len(inline) == 7
    assert all(w >= 0.2 for w in inline), inline
    assert max(ahead) < 0.1, ahead


def test_batch_to_device(prepared: Path) -> None:
    b = run(TokenBatchStream(prepared, "valid", data_cfg(num_workers=0), shuffle=False), 1)[0]
    c = b.to("cpu", non_blocking=True)
    assert torch.equal(c.src, b.src) and c.keys == b.keys and c.n_tgt_tokens == b.n_tgt_tokens


def test_a_pickled_batch_carries_arrays_and_comes_back_whole(prepared: Path) -> None:
    """What a loader worker sends its rank: the ids as bytes in the pickle (no tensor, whose
    shared-memory segment would cross on a connection of its own), the same batch out."""
    b = run(TokenBatchStream(prepared, "valid", data_cfg(num_workers=0), shuffle=False), 1)[0]
    data = pickle.dumps(b)
    assert b"torch" not in data  # no tensor, storage or torch reduction inside
    ids = sum(getattr(b, name).numel() for name in ("src", "tgt_in", "tgt_out"))
    words = sum(len(t.encode()) + 8 for t in (*b.keys, *b.src_text, *b.tgt_text))
    assert 2 * ids < len(data) < 2 * ids + words + 1000  # the ids as uint16, not int64
    c = pickle.loads(data)
    for name in ("src", "tgt_in", "tgt_out"):
        assert getattr(c, name).dtype == torch.int64
        assert torch.equal(getattr(c, name), getattr(b, name))
    assert (c.keys, c.src_text, c.tgt_text) == (b.keys, b.src_text, b.tgt_text)
    assert (c.n_src_tokens, c.n_tgt_tokens) == (b.n_src_tokens, b.n_tgt_tokens)


def test_epoch_union_across_ranks_is_the_manifest(prepared: Path) -> None:
    cfg = data_cfg()
    keys: list[str] = []
    seen = 0
    for rank in range(2):
        s = TokenBatchStream(prepared, "train", cfg, rank=rank, world_size=2, epochs=1)
        for b in s:
            keys += b.keys
        st = s.stats()
        assert st["epoch"] == 1 and st["samples_skipped_long"] == 0 and st["bad_shards"] == []
        seen += st["samples_seen"]
    expected = all_keys(prepared, "train")
    assert len(keys) == len(set(keys)) == seen
    assert sorted(keys) == sorted(expected)


def test_deterministic_and_epochs_differ(prepared: Path) -> None:
    cfg = data_cfg(num_workers=0)
    a = run(TokenBatchStream(prepared, "train", cfg), 15)
    b = run(TokenBatchStream(prepared, "train", cfg), 15)
    c = run(TokenBatchStream(prepared, "train", cfg, start_epoch=1), 15)
    assert same(a, b)
    assert not same(a, c)


def test_max_len_skips_train_only(prepared: Path) -> None:
    cfg = data_cfg(max_len=24, max_tokens=512, num_workers=0)
    s = TokenBatchStream(prepared, "train", cfg, epochs=1)
    batches = run(s)
    assert all(b.src.shape[1] <= 24 and b.tgt_in.shape[1] <= 24 for b in batches)
    st = s.stats()
    total = read_manifest(prepared)["splits"]["train"]["samples"]
    assert st["samples_skipped_long"] > 0
    assert st["samples_seen"] + st["samples_skipped_long"] == total
    v = TokenBatchStream(prepared, "valid", cfg, shuffle=False, epochs=1)
    assert sum(len(b) for b in v) == 150 and v.stats()["samples_skipped_long"] == 0


@pytest.mark.parametrize("world_size,workers", [(2, 2), (3, 1)])
def test_valid_split_covers_everything_once(prepared: Path, world_size: int, workers: int) -> None:
    # One valid shard, fewer than the producer slots: split by sample index.
    cfg = data_cfg(num_workers=workers, max_len=16)
    per_rank = []
    for rank in range(world_size):
        s = TokenBatchStream(
            prepared, "valid", cfg, rank=rank, world_size=world_size, shuffle=False, epochs=1
        )
        per_rank.append([k for b in s for k in b.keys])
    assert all(per_rank)
    keys = [k for r in per_rank for k in r]
    assert Counter(keys) == Counter(all_keys(prepared, "valid"))


def test_batches_received_ahead_count_only_once_handed_out(prepared: Path) -> None:
    """The rank's receiver thread (data.prefetch) takes batches off the workers' queue ahead of
    the consumer: the same batches in the same order as without it, and the saved position is
    the last batch handed out, not the last one received."""
    got: dict[int, tuple[list[Batch], dict]] = {}
    for prefetch in (0, 8):
        s = TokenBatchStream(prepared, "train", data_cfg(prefetch=prefetch), rank=1, world_size=2)
        it = iter(s)
        batches = [next(it) for _ in range(5)]
        time.sleep(0.5)  # the thread fills its queue meanwhile
        got[prefetch] = (batches, s.state_dict())
        threads = [r._thread for r in s._receivers]
        assert len(threads) == (prefetch > 0) and all(t.is_alive() for t in threads)
        s.close()  # joins the receiver: none may run on into the interpreter's exit
        assert not any(t.is_alive() for t in threads) and not s._receivers
        del it
        # the exit hook that closes it holds it weakly: a stream done with is freed
        ref = weakref.ref(s)
        del s
        gc.collect()
        assert ref() is None
    assert same(got[0][0], got[8][0])
    assert got[0][1] == got[8][1]


def test_a_stream_freed_without_close_lets_its_workers_end(prepared: Path) -> None:
    """Its workers take TERM only once the stream's closing event is set (at close(), or at
    exit for a stream still alive): a stream freed unclosed sets it too, or the process would
    wait for them forever at its exit."""
    s = TokenBatchStream(prepared, "train", data_cfg(), rank=0, world_size=1)
    it = iter(s)
    next(it)
    closing = s._closing
    assert closing is not None and not closing.is_set()
    del it, s
    gc.collect()
    assert closing.is_set()


@pytest.mark.parametrize("workers,k,prefetch", [(2, 7, 4), (2, 7, 0), (0, 12, 4)])
def test_resume_is_exact(prepared: Path, workers: int, k: int, prefetch: int) -> None:
    cfg = data_cfg(num_workers=workers, prefetch=prefetch)
    for rank in range(2):
        s = TokenBatchStream(prepared, "train", cfg, rank=rank, world_size=2)
        it = iter(s)
        for _ in range(k + rank):
            next(it)
        state = json.loads(json.dumps(s.state_dict()))  # JSON round trip
        assert len(json.dumps(state)) < 4000
        expected = [next(it) for _ in range(20)]
        del it
        again = TokenBatchStream(prepared, "train", cfg, rank=rank, world_size=2)
        again.load_state_dict(state)
        assert same(run(again, 20), expected)


def test_resume_across_epoch_boundary_endless(prepared: Path) -> None:
    cfg = data_cfg(max_tokens=2048, shuffle_buffer=300)
    s = TokenBatchStream(prepared, "train", cfg)
    it = iter(s)
    n = 0
    while s.stats()["worker_epochs"] == [0, 0]:
        next(it)
        n += 1
    state = s.state_dict()
    expected = [next(it) for _ in range(20)]
    del it
    again = TokenBatchStream(prepared, "train", cfg)
    again.load_state_dict(state)
    assert same(run(again, 20), expected)
    assert n > 10


def test_resume_on_another_world_size(prepared: Path) -> None:
    """2 ranks x 2 workers stop mid-epoch (one rank already in epoch 1), 3 ranks x 1 worker and
    then 1 rank x 3 workers finish: over the two epochs every sample comes exactly twice."""
    keys: list[str] = []
    cfg = data_cfg()
    states = []
    for rank in (0, 1):
        s = TokenBatchStream(prepared, "train", cfg, rank=rank, world_size=2, epochs=2)
        it = iter(s)
        for _ in range(9):
            keys += next(it).keys
        # rank 1 goes on until a worker of it is in its second epoch, then reads a few more
        while rank == 1 and max(w["epoch"] for w in s.state_dict()["workers"]) == 0:
            keys += next(it).keys
        for _ in range(5 * rank):
            keys += next(it).keys
        states.append(s.state_dict())
        del it
    assert max(max(st["workers"], key=lambda w: w["epoch"])["epoch"] for st in states) == 1
    merged = json.loads(json.dumps(TokenBatchStream.merge_state_dicts(states)))
    states = []
    for rank in range(3):
        s = TokenBatchStream(
            prepared, "train", data_cfg(num_workers=1), rank=rank, world_size=3, epochs=2
        )
        s.load_state_dict(merged)
        keys += [k for b in run(s, 12) for k in b.keys]
        states.append(s.state_dict())
    merged = TokenBatchStream.merge_state_dicts(states)
    last = TokenBatchStream(prepared, "train", data_cfg(num_workers=3), epochs=2)
    last.load_state_dict(merged)
    keys += [k for b in last for k in b.keys]
    counts = Counter(keys)
    assert set(counts) == set(all_keys(prepared, "train"))
    assert set(counts.values()) == {2}
    assert last.stats()["samples_seen"] == len(keys)


def test_state_errors(prepared: Path) -> None:
    cfg = data_cfg(num_workers=1)
    s = TokenBatchStream(prepared, "train", cfg, rank=0, world_size=2)
    run(s, 3)
    other = TokenBatchStream(prepared, "train", cfg, rank=0, world_size=4)
    with pytest.raises(ValueError, match=r"world size 2 .* world size 4") as exc:
        other.load_state_dict(s.state_dict())
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="all 2 ranks"):
        TokenBatchStream.merge_state_dicts([s.state_dict()])
    # The single valid shard is split by sample across slots: another world size cannot
    # continue it mid-epoch.
    vs = []
    for rank in range(2):
        v = TokenBatchStream(prepared, "valid", cfg, rank=rank, world_size=2, shuffle=False)
        run(v, 2)
        vs.append(v.state_dict())
    v3 = TokenBatchStream(prepared, "valid", cfg, rank=0, world_size=3, shuffle=False)
    with pytest.raises(ValueError, match="world size 2 on world size 3"):
        v3.load_state_dict(TokenBatchStream.merge_state_dicts(vs))


def _rewrite(path: Path, fn: Callable[[str, bytes], bytes]) -> None:
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for m, data in members:
            data = fn(m.name, data)
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))


def _damage(data_dir: Path) -> tuple[set[str], int]:
    """Truncate one shard mid-member, scramble a header in another, break one sample's bytes
    in a third; returns (names of the damaged shards, samples no longer readable)."""
    shards = read_manifest(data_dir)["splits"]["train"]["shards"]
    # 1. truncated in the middle of the file (tar error part-way)
    p1 = data_dir / shards[1]["name"]
    p1.write_bytes(p1.read_bytes()[: p1.stat().st_size // 2 + 100])
    # 2. a garbage header block two thirds in (tarfile just stops there)
    p3 = data_dir / shards[3]["name"]
    raw = bytearray(p3.read_bytes())
    with tarfile.open(p3) as tar:
        members = tar.getmembers()
    offset = members[len(members) * 2 // 3 + 1].offset  # a tgt.ids member: leaves a partial sample
    raw[offset : offset + 512] = b"\xff" * 512
    p3.write_bytes(bytes(raw))
    # 3. one sample with an odd number of id bytes (sample-level damage; the shard stays good)
    p4 = data_dir / shards[4]["name"]
    key = next(iter_shard(p4)).key
    _rewrite(p4, lambda n, d: d[:-1] if n == f"{key}.tgt.ids" else d)

    def complete(p: Path) -> int:
        n = 0
        try:
            for s in iter_shard(p):
                n += len(s.parts) == 4
        except ShardReadError:
            pass
        return n

    lost = sum(shards[i]["samples"] - complete(p) for i, p in ((1, p1), (3, p3))) + 1
    return {shards[1]["name"], shards[3]["name"]}, lost


def test_damaged_shards_are_skipped_and_counted(
    prepared_copy: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad, lost = _damage(prepared_copy)
    total = read_manifest(prepared_copy)["splits"]["train"]["samples"]
    for world_size, workers in ((2, 2), (1, 0)):
        seen = skipped = corrupt = 0
        bad_named: set[str] = set()
        keys: list[str] = []
        with caplog.at_level(logging.WARNING, logger="data_pipeline.loader"):
            for rank in range(world_size):
                s = TokenBatchStream(
                    prepared_copy,
                    "train",
                    data_cfg(num_workers=workers, store="tar"),  # the tars' damage
                    rank=rank,
                    world_size=world_size,
                    epochs=1,
                )
                keys += [k for b in s for k in b.keys]
                st = s.stats()
                seen += st["samples_seen"]
                skipped += st["samples_skipped_corrupt"] + st["samples_skipped_long"]
                corrupt += st["samples_skipped_corrupt"]
                bad_named |= set(st["bad_shards"])
        assert bad_named == bad
        assert seen == len(keys) == len(set(keys))
        assert seen + skipped == total
        assert corrupt == lost > 1
    assert any("train-000001" in r.getMessage() for r in caplog.records)  # num_workers=0 run


def test_resume_inside_damaged_epoch_keeps_accounting(prepared_copy: Path) -> None:
    _damage(prepared_copy)
    total = read_manifest(prepared_copy)["splits"]["train"]["samples"]
    cfg = data_cfg(num_workers=2, store="tar")
    s = TokenBatchStream(prepared_copy, "train", cfg, epochs=1)
    first = run(s, 40)
    s2 = TokenBatchStream(prepared_copy, "train", cfg, epochs=1)
    s2.load_state_dict(s.state_dict())
    rest = run(s2)
    st = s2.stats()
    assert st["samples_seen"] == sum(len(b) for b in first + rest)
    assert st["samples_seen"] + st["samples_skipped_corrupt"] + st["samples_skipped_long"] == total


def test_manifest_errors(tmp_path: Path, prepared: Path) -> None:
    with pytest.raises(FileNotFoundError, match="manifest not found"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="invalid manifest: not JSON"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 2}))
    with pytest.raises(ValueError, match="invalid manifest: version"):
        read_manifest(tmp_path)
    with pytest.raises(ValueError, match="split 'dev' not prepared"):
        TokenBatchStream(prepared, "dev", data_cfg())


def test_resume_with_other_batching_skips_nothing(prepared: Path) -> None:
    """A smaller max_tokens after a resume (e.g. after an OOM) replays the open windows:
    samples may repeat, none is lost."""
    s = TokenBatchStream(prepared, "train", data_cfg(num_workers=0), epochs=1)
    keys = [k for b in run(s, 30) for k in b.keys]
    smaller = TokenBatchStream(prepared, "train", data_cfg(num_workers=0, max_tokens=256), epochs=1)
    smaller.load_state_dict(s.state_dict())
    rest = run(smaller)
    assert all(len(b) * max(b.src.shape[1], b.tgt_in.shape[1]) <= 256 for b in rest)
    keys += [k for b in rest for k in b.keys]
    assert set(keys) == set(all_keys(prepared, "train"))
    assert len(keys) - len(set(keys)) <= 100  # at most one window (shuffle_buffer) again


def test_load_state_dicts_picks_own_or_merges(prepared: Path) -> None:
    cfg = data_cfg(num_workers=1)
    old = []
    for rank in range(2):
        s = TokenBatchStream(prepared, "train", cfg, rank=rank, world_size=2, epochs=1)
        run(s, 5 + rank)
        old.append(s.state_dict())
    same = TokenBatchStream(prepared, "train", cfg, rank=1, world_size=2, epochs=1)
    same.load_state_dicts(old)
    assert same.state_dict()["workers"] == old[1]["workers"]
    keys: list[str] = []  # what the new world delivers (the old one's counts are in stats)
    total = 0
    for rank in range(3):
        s = TokenBatchStream(prepared, "train", cfg, rank=rank, world_size=3, epochs=1)
        s.load_state_dicts(old)
        keys += [k for b in s for k in b.keys]
        total += s.stats()["samples_seen"]
    assert total == read_manifest(prepared)["splits"]["train"]["samples"]
    assert (
        len(keys)
        == len(set(keys))
        == total - sum(st["workers"][0]["counters"]["samples_seen"] for st in old)
    )


def test_loader_workers_survive_stop_signals(prepared: Path) -> None:
    """USR1 and INT sent to a loader worker (as Slurm and a terminal may: to every process)
    leave it running: the rank decides when to stop, and the stream goes on."""
    import os
    import signal

    cfg = data_cfg(max_tokens=512, shuffle_buffer=100, num_workers=2)
    straight = [b.keys for b in TokenBatchStream(prepared, "train", cfg, epochs=1)]
    stream = iter(TokenBatchStream(prepared, "train", cfg, epochs=1))
    got = [next(stream).keys, next(stream).keys]  # round robin: both workers are running
    workers = loader_workers()
    assert len(workers) == 2
    for sig in (signal.SIGUSR1, signal.SIGINT):
        for pid in workers:
            os.kill(pid, sig)
    time.sleep(0.5)
    got += [b.keys for b in stream]
    assert got == straight


def _signal_masks(pid: int) -> dict[str, set[int]]:
    """Blocked and ignored signals of a process, from /proc/PID/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("SigBlk", "SigIgn"):
            bits = int(value.strip(), 16)
            out[key] = {n for n in range(1, 65) if bits >> (n - 1) & 1}
    return out


def loader_workers() -> list[int]:
    """This process's loader workers: the children of its fork server (data_pipeline/loader.py)."""
    from launch.local import child_pids

    servers = [pid for pid, cmd in _children(os.getpid()).items() if b"forkserver" in cmd]
    assert len(servers) == 1, _children(os.getpid())
    return child_pids(servers[0])


def _children(pid: int) -> dict[int, bytes]:
    """Direct children of `pid` and their command lines."""
    from launch.local import child_pids

    return {c: Path(f"/proc/{c}/cmdline").read_bytes() for c in child_pids(pid)}


def test_loader_workers_start_with_stop_signals_held_until_they_handle_them(
    prepared: Path,
) -> None:
    """Workers are not forked from the (multi-threaded) rank but from its fork server, which
    holds the stop signals (as does the resource tracker), so a stop signal in a worker's first
    moments waits for its own handlers instead of killing it: once started they block none of
    TERM, INT, USR1 and ignore INT and USR1 (ignore_stop_signals). No TERM, INT or USR1 to
    every process of a job ends the server or the tracker. The rank's own mask is as it was."""
    import signal

    stop = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}
    before = _signal_masks(os.getpid())["SigBlk"]
    stream = iter(TokenBatchStream(prepared, "train", data_cfg(num_workers=2), epochs=1))
    next(stream), next(stream)  # round robin: both workers are running
    assert _signal_masks(os.getpid())["SigBlk"] == before
    children = _children(os.getpid())
    servers = [pid for pid, cmd in children.items() if b"forkserver" in cmd]
    trackers = [pid for pid, cmd in children.items() if b"resource_tracker" in cmd]
    assert len(servers) == 1 and len(trackers) == 1, children
    workers = loader_workers()
    assert len(workers) == 2
    for pid in workers:
        masks = _signal_masks(pid)
        assert not stop & masks["SigBlk"], masks
        assert {signal.SIGINT, signal.SIGUSR1} <= masks["SigIgn"], masks
    for pid in [*servers, *trackers]:
        assert stop <= _signal_masks(pid)["SigBlk"] | _signal_masks(pid)["SigIgn"]


KILLED_RANK = """
import sys, time
from pathlib import Path
from data_pipeline.loader import TokenBatchStream
from tests.data_pipeline.conftest import data_cfg
stream = iter(TokenBatchStream(Path(sys.argv[1]), "train", data_cfg(num_workers=2), epochs=1))
next(stream), next(stream)  # round robin: both workers are running
print("reading", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_the_workers_and_fork_server_of_a_killed_rank_exit(prepared: Path) -> None:
    """A rank killed with SIGKILL (the OOM killer, a fault) closes nothing: its loader workers
    (children of its fork server, not of the rank) and the fork server (which waits for the
    workers it made) still end by themselves within seconds, leaving no process to hold
    memory or the job's output open."""
    import subprocess
    import sys

    from data_pipeline.worker_signals import process_alive
    from launch.local import child_pids

    root = Path(__file__).resolve().parents[2]
    rank = subprocess.Popen(
        [sys.executable, "-c", KILLED_RANK, str(prepared)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
    )
    try:
        assert rank.stdout is not None and rank.stdout.readline() == b"reading\n"
        children = _children(rank.pid)
        servers = [pid for pid, cmd in children.items() if b"forkserver" in cmd]
        assert len(servers) == 1, children
        workers = child_pids(servers[0])
        assert len(workers) == 2
    finally:
        rank.kill()
        rank.wait()
    left = [*servers, *workers]
    deadline = time.monotonic() + 30
    while any(map(process_alive, left)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in left if process_alive(pid)]
