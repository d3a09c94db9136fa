"""Streams token-budget micro-batches from prepared shards to one rank, resumably.

How the data is dealt
---------------------
The unit of work is a *unit*: a whole shard, or - when a split has fewer shards than there
are producer slots (``world_size * max(1, num_workers)``) - the samples ``i % n == p`` of a
shard, for each of the ``n = slots`` parts ``p``.  Per epoch the units are ordered (shards
shuffled from ``(seed, epoch)`` when ``shuffle``) and dealt round robin: slot ``s`` takes units
``s, s + slots, ...``; slot ``s`` is worker ``s % workers`` of rank ``s // workers``.  So every
rank gets a disjoint part and the union is the whole split, for any world size.

A slot reads each unit in windows of ``cfg.shuffle_buffer`` samples.  A window is shuffled
from ``(seed, epoch, unit, window start)``, bucketed by length and cut into token-budget
batches (:mod:`data_pipeline.batching`), whose order is shuffled too.  A window therefore
depends on nothing but its unit and position: the stream of batches of a unit is the same
whichever slot reads it, which is what makes resuming exact, also on another world size.

Position and resume
-------------------
Each batch carries its producer's position after it: ``(epoch, index of the unit in the
slot's plan, window start, batches already yielded from that window)`` plus the producer's
counters.  The main process keeps, per worker, the position of the last batch it handed to
the consumer (not what the DataLoader prefetched) and which worker comes next: the
DataLoader hands batches out round robin over its workers, so rotating which DataLoader
worker plays which logical worker reproduces the order after a resume.  A resumed worker
seeks to its unit and window (reading past the earlier samples of the tar), rebuilds the
window and drops the batches already delivered.

For a different world size, :meth:`TokenBatchStream.merge_state_dicts` turns the states of
all old ranks into per-unit progress (finished units and a window position for started
ones, per epoch); each new rank loads that and deals the unfinished units of those epochs
among the new slots, so the epoch continues without repeating or skipping a sample.

Damage
------
A corrupt or truncated shard is skipped from the point of damage: the samples it did not
deliver (counted against the manifest's per-shard count) are added to
``samples_skipped_corrupt`` and the shard is named in ``bad_shards`` and in a warning.  A
malformed sample (bad id bytes, ids beyond the vocabulary) is skipped and counted the same
way.  Per epoch, ``samples_seen + samples_skipped_long + samples_skipped_corrupt`` equals the
manifest's sample count of the split.
"""

from __future__ import annotations

import copy
import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from data_pipeline.batching import BATCHING_VERSION, Batch, Sample, collate, plan_batches
from data_pipeline.config import DataConfig
from data_pipeline.manifest import read_manifest as _read_manifest
from data_pipeline.shards import RawSample, ShardReadError, decode_sample, iter_shard

log = logging.getLogger(__name__)

STATE_VERSION = 1
DEFAULT_WINDOW = 1000  # window (samples) for bucketing when cfg.shuffle_buffer == 0
COUNTERS = ("samples_seen", "samples_skipped_long", "samples_skipped_corrupt", "batches")

__all__ = ["Batch", "TokenBatchStream", "read_manifest"]


def read_manifest(data_dir: Path) -> dict:
    """Load and validate ``data_dir/manifest.json`` (one-line errors; see ``manifest.py``)."""
    return _read_manifest(Path(data_dir))


# --------------------------------------------------------------------------------------------
# Dealing units to slots (pure functions of seed, epoch, shard count and slot count)

Unit = tuple[int, int, int]  # (shard index in the manifest, part, number of parts)


def unit_key(u: Unit) -> str:
    """JSON-friendly name of a unit: ``"7"`` for a whole shard, ``"7:1/4"`` for a part."""
    return str(u[0]) if u[2] == 1 else f"{u[0]}:{u[1]}/{u[2]}"


def parts_for(n_shards: int, n_slots: int) -> int:
    """Shards are split by sample index when there are fewer of them than slots."""
    return 1 if n_shards >= n_slots else n_slots


def epoch_units(n_shards: int, n_slots: int, seed: int, epoch: int, shuffle: bool) -> list[Unit]:
    """All units of an epoch in dealing order."""
    order = list(range(n_shards))
    if shuffle:
        order = np.random.default_rng([seed, epoch, 0x5EED]).permutation(n_shards).tolist()
    n = parts_for(n_shards, n_slots)
    return [(s, p, n) for s in order for p in range(n)]


def slot_plan(
    n_shards: int,
    n_slots: int,
    slot: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    done: frozenset[str] | set[str] = frozenset(),
) -> list[Unit]:
    """Units that ``slot`` processes in ``epoch``: the not-``done`` units dealt round robin."""
    units = [
        u for u in epoch_units(n_shards, n_slots, seed, epoch, shuffle) if unit_key(u) not in done
    ]
    return units[slot::n_slots]


# --------------------------------------------------------------------------------------------
def _ignore_stop_signals(worker_id: int) -> None:
    """Loader workers leave USR1 (preemption: Slurm may send it to every process of a job
    step) and Ctrl-C's INT (sent to the whole process group) to their rank, which finishes its
    step and saves.  TERM keeps its default: the DataLoader and multiprocessing end a worker
    that is blocked on a full queue with it, and a worker ignoring it would hang the exit."""
    for sig in (signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


# The producer (runs in a DataLoader worker, or in the main process with num_workers == 0)


@dataclass
class _Item:
    """What a producer yields: its worker id, its position after this item, maybe a batch."""

    worker: int
    pos: dict[str, Any]
    batch: Batch | None

    def pin_memory(self) -> _Item:
        """Called by the DataLoader's pinning thread (``pin_memory=True``)."""
        return _Item(self.worker, self.pos, self.batch.pin_memory() if self.batch else None)


def _identity(x: Any) -> Any:
    return x


def _zero_counters() -> dict[str, Any]:
    return {**dict.fromkeys(COUNTERS, 0), "bad_shards": []}


def _fresh_pos(epoch: int) -> dict[str, Any]:
    # ws == -1: the unit at idx is not started yet (take the merged progress or 0).
    return {"epoch": epoch, "idx": 0, "ws": -1, "bd": 0, "counters": _zero_counters()}


@dataclass
class _Context:
    """Everything a producer needs (picklable; shipped to DataLoader workers)."""

    data_dir: str
    split: str
    shards: list[dict[str, Any]]  # manifest entries: name, samples
    dtype: str
    vocab_size: int
    max_tokens: int
    max_len: int
    pad_multiple: int
    bucket_width: int
    batch_multiple: int
    window: int
    shuffle: bool
    skip_long: bool
    seed: int
    n_slots: int
    slot0: int  # first slot of this rank: rank * workers
    end_epoch: int | None  # exclusive; None = endless
    base: dict[int, dict[str, Any]]  # epoch -> {"done": set[str], "partial": {key: [ws, bd]}}


def _unit_expected(ctx: _Context, u: Unit) -> int:
    n = ctx.shards[u[0]]["samples"]
    return len(range(u[1], n, u[2]))


def _read_unit(
    ctx: _Context, u: Unit, start: int, pending: dict[str, Any]
) -> Iterator[tuple[int, list[RawSample]]]:
    """Windows ``(window start, raw samples)`` of a unit from sample offset ``start`` on.

    On damage the partial window is still yielded; what the shard did not deliver is added
    to ``pending`` as a window-level statistic (``lost``/``bad``) for the caller to account.
    """
    shard = ctx.shards[u[0]]
    path = Path(ctx.data_dir) / shard["name"]
    expected = _unit_expected(ctx, u)
    k = 0  # unit samples read so far
    window: list[RawSample] = []
    ws = start
    error: str | None = None
    try:
        # Unit sample number `start` is raw sample `part + start * parts`: seek up to it.
        for raw in iter_shard(path, skip_before=u[1] + start * u[2]):
            if raw.index % u[2] != u[1]:
                continue
            k += 1
            if k <= start:
                continue
            window.append(raw)
            if len(window) == ctx.window:
                yield ws, window
                ws, window = ws + len(window), []
    except ShardReadError as exc:
        error = str(exc)
    except FileNotFoundError:
        error = f"{shard['name']}: missing"
    if error is None and k < expected:
        error = f"{shard['name']}: truncated ({k} of {expected} samples)"
    if error is not None:
        pending["lost"] = expected - max(k, start)
        pending["bad"] = shard["name"]
        pending["error"] = error
    if window or error is not None:
        yield ws, window


def _produce(ctx: _Context, worker: int, slot: int, pos: dict[str, Any]) -> Iterator[_Item]:
    """The batches of one producer slot from ``pos`` on (see the module docstring)."""
    pos = copy.deepcopy(pos)
    counters = pos["counters"]
    pending = _zero_counters()  # window statistics not yet delivered with a batch

    def flush() -> None:
        for k in COUNTERS:
            counters[k] += pending[k]
        for name in pending["bad_shards"]:
            if name not in counters["bad_shards"]:
                counters["bad_shards"].append(name)
        pending.update(_zero_counters())

    while ctx.end_epoch is None or pos["epoch"] < ctx.end_epoch:
        epoch = pos["epoch"]
        base = ctx.base.get(epoch)
        plan = slot_plan(
            len(ctx.shards),
            ctx.n_slots,
            slot,
            ctx.seed,
            epoch,
            ctx.shuffle,
            base["done"] if base else frozenset(),
        )
        produced = 0
        fresh = pos["idx"] == 0 and pos["ws"] < 0  # a whole epoch ahead (not a resumed one)
        while pos["idx"] < len(plan):
            u = plan[pos["idx"]]
            if pos["ws"] < 0:
                ws, bd = (base["partial"].get(unit_key(u), (0, 0))) if base else (0, 0)
                pos["ws"], pos["bd"] = int(ws), int(bd)
            damage: dict[str, Any] = {}
            for ws, raws in _read_unit(ctx, u, pos["ws"], damage):
                skip_stats = pos["bd"] == 0  # else counted when this window was first built
                samples: list[Sample] = []
                for raw in raws:
                    try:
                        src, tgt = decode_sample(raw, ctx.dtype, ctx.vocab_size)
                    except ValueError:
                        if skip_stats:
                            pending["samples_skipped_corrupt"] += 1
                        continue
                    sample = Sample(
                        raw.key,
                        src,
                        tgt,
                        raw.parts.get("src.txt", b"").decode("utf-8", "replace"),
                        raw.parts.get("tgt.txt", b"").decode("utf-8", "replace"),
                    )
                    if ctx.skip_long and max(sample.src_len, sample.tgt_len) > ctx.max_len:
                        if skip_stats:
                            pending["samples_skipped_long"] += 1
                        continue
                    samples.append(sample)
                if "bad" in damage and skip_stats:
                    pending["samples_skipped_corrupt"] += damage["lost"]
                    pending["bad_shards"].append(damage["bad"])
                    log.warning(
                        "data %s: skipping the rest of %s (%d samples lost)",
                        ctx.split,
                        damage["error"],
                        damage["lost"],
                    )
                rng = (
                    np.random.default_rng([ctx.seed, epoch, u[0], u[1], u[2], ws])
                    if ctx.shuffle
                    else None
                )
                groups = plan_batches(
                    samples,
                    max_tokens=ctx.max_tokens,
                    pad_multiple=ctx.pad_multiple,
                    bucket_width=ctx.bucket_width,
                    rng=rng,
                    batch_multiple=ctx.batch_multiple,
                )
                for j in range(pos["bd"], len(groups)):
                    batch = collate([samples[i] for i in groups[j]], ctx.pad_multiple)
                    flush()
                    counters["samples_seen"] += len(batch)
                    counters["batches"] += 1
                    pos["ws"], pos["bd"] = ws, j + 1
                    produced += 1
                    yield _Item(worker, copy.deepcopy(pos), batch)
                pos["ws"], pos["bd"] = ws + len(raws), 0
            pos["idx"] += 1
            pos["ws"], pos["bd"] = -1, 0
        pos["epoch"] += 1
        pos["idx"], pos["ws"], pos["bd"] = 0, -1, 0
        if ctx.end_epoch is None and fresh and base is None and produced == 0:
            # Endless and a whole epoch gave nothing (e.g. every pair too long): stop, don't spin.
            log.warning(
                "data %s: slot %d produced no batch in epoch %d; stopping it",
                ctx.split,
                slot,
                epoch,
            )
            break
    flush()
    yield _Item(worker, copy.deepcopy(pos), None)


class _WorkerDataset(IterableDataset):
    """Runs logical worker ``(worker id + rotation) % workers`` in each DataLoader worker."""

    def __init__(self, ctx: _Context, positions: list[dict[str, Any]], rotation: int) -> None:
        super().__init__()
        self.ctx = ctx
        self.positions = positions
        self.rotation = rotation

    def __iter__(self) -> Iterator[_Item]:
        info = get_worker_info()
        n = len(self.positions)
        worker = ((info.id if info is not None else 0) + self.rotation) % n
        return _produce(self.ctx, worker, self.ctx.slot0 + worker, self.positions[worker])


# --------------------------------------------------------------------------------------------
# The public stream


def _base_to_json(base: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "epoch": e,
            "done": sorted(b["done"]),
            "partial": {k: list(v) for k, v in b["partial"].items()},
        }
        for e, b in sorted(base.items())
    ]


def _base_from_json(items: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {
        int(b["epoch"]): {
            "done": set(b["done"]),
            "partial": {k: (int(v[0]), int(v[1])) for k, v in b["partial"].items()},
        }
        for b in items
    }


class TokenBatchStream:
    """Iterable of :class:`Batch` for one rank of one split (see the module docstring).

    ``epochs`` epochs from ``start_epoch`` (``None``: endless).  ``shuffle`` shuffles shards,
    windows and batch order; pairs longer than ``cfg.max_len`` are skipped on the training
    split only.  ``state_dict``/``load_state_dict`` save and restore the exact position as of
    the last batch the consumer received; :meth:`merge_state_dicts` carries it over to
    another world size (or worker count).  ``pin_memory`` hands out batches in page-locked
    memory (set it on CUDA after ``torch.cuda.set_device``, so ``to(non_blocking=True)``
    overlaps the copy).
    """

    def __init__(
        self,
        data_dir: Path,
        split: str,
        cfg: DataConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        epochs: int | None = None,
        start_epoch: int = 0,
        pin_memory: bool = False,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        problems = cfg.problems()
        if problems:
            raise ValueError("data config: " + "; ".join(f"{k} {v}" for k, v in problems))
        self.data_dir = Path(data_dir)
        self.manifest = read_manifest(self.data_dir)
        if split not in self.manifest["splits"]:
            raise ValueError(
                f"{self.data_dir}: split {split!r} not prepared "
                f"(have {', '.join(self.manifest['splits'])})"
            )
        self.split = split
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.epochs = epochs
        self.start_epoch = start_epoch
        self.pin_memory = pin_memory
        self.num_workers = max(1, cfg.num_workers)  # logical producers per rank
        shards = self.manifest["splits"][split]["shards"]
        self.n_shards = len(shards)
        self._ctx = _Context(
            data_dir=str(self.data_dir),
            split=split,
            shards=[{"name": s["name"], "samples": s["samples"]} for s in shards],
            dtype=self.manifest["dtype"],
            vocab_size=self.manifest["vocab_size"],
            max_tokens=cfg.max_tokens,
            max_len=cfg.max_len,
            pad_multiple=cfg.pad_multiple,
            bucket_width=cfg.bucket_width,
            batch_multiple=cfg.batch_multiple,
            window=cfg.shuffle_buffer if cfg.shuffle_buffer > 0 else DEFAULT_WINDOW,
            shuffle=shuffle,
            skip_long=split == "train",
            seed=cfg.seed,
            n_slots=world_size * self.num_workers,
            slot0=rank * self.num_workers,
            end_epoch=None if epochs is None else start_epoch + epochs,
            base={},
        )
        self._positions = [_fresh_pos(start_epoch) for _ in range(self.num_workers)]
        self._next = 0
        self._base_counters = _zero_counters()
        self._last_epoch = start_epoch

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """Batches from the current position on (a new iterator continues where the last
        delivered batch left off)."""
        positions = copy.deepcopy(self._positions)
        if self.cfg.num_workers == 0:
            items: Any = _produce(self._ctx, 0, self._ctx.slot0, positions[0])
        else:
            items = DataLoader(
                _WorkerDataset(self._ctx, positions, self._next),
                batch_size=None,
                num_workers=self.cfg.num_workers,
                collate_fn=_identity,
                worker_init_fn=_ignore_stop_signals,
                prefetch_factor=2,
                pin_memory=self.pin_memory,
                # Its own generator: creating the iterator must not draw from the global torch
                # RNG, which the trainer restores on resume (dropout must continue exactly).
                generator=torch.Generator().manual_seed(self.cfg.seed),
            )
        for item in items:
            self._positions[item.worker] = item.pos
            self._next = (item.worker + 1) % self.num_workers
            if item.batch is None:
                continue
            if self.pin_memory and self.cfg.num_workers == 0:
                item = item.pin_memory()
            self._last_epoch = item.pos["epoch"]
            yield item.batch

    # -- counters ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters as of the last delivered batch, summed over this rank's workers.

        ``epoch``: the epoch the slowest worker is in (== the end epoch once finished);
        ``worker_epochs`` per worker.
        """
        out = {k: self._base_counters[k] for k in COUNTERS}
        bad = list(self._base_counters["bad_shards"])
        for p in self._positions:
            for k in COUNTERS:
                out[k] += p["counters"][k]
            bad += [b for b in p["counters"]["bad_shards"] if b not in bad]
        out["bad_shards"] = bad
        out["epoch"] = min(p["epoch"] for p in self._positions)
        out["worker_epochs"] = [p["epoch"] for p in self._positions]
        return out

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Small JSON-serialisable position (no sample data) of this rank."""
        return {
            "version": STATE_VERSION,
            "kind": "rank",
            "split": self.split,
            "seed": self.cfg.seed,
            "shuffle": self.shuffle,
            "n_shards": self.n_shards,
            "world_size": self.world_size,
            "rank": self.rank,
            "num_workers": self.num_workers,
            "workers": copy.deepcopy(self._positions),
            "next": self._next,
            "base": _base_to_json(self._ctx.base),
            "base_counters": copy.deepcopy(self._base_counters),
            "batching": self._batching(),
        }

    def _batching(self) -> list[int]:
        """What the cut of a window depends on besides the data (saved with the state); a state
        saved by an older batching algorithm (no version, or another one) replays its windows."""
        c = self._ctx
        return [
            c.window,
            c.max_tokens,
            c.max_len,
            c.pad_multiple,
            c.bucket_width,
            c.batch_multiple,
            BATCHING_VERSION,
        ]

    def _replay_windows_if_rebatched(self, d: dict[str, Any]) -> None:
        """With other batching settings the saved "batches done in this window" counts mean
        nothing: restart each open window (its samples may repeat; none is skipped)."""
        if d.get("batching") == self._batching():
            return
        log.warning(
            "data %s: batching settings changed since the state was saved (%s -> %s); "
            "replaying the open shuffle windows",
            self.split,
            d.get("batching"),
            self._batching(),
        )
        for p in self._positions:
            p["bd"] = 0
        for b in self._ctx.base.values():
            b["partial"] = {k: (ws, 0) for k, (ws, _) in b["partial"].items()}

    def _check_common(self, d: dict[str, Any]) -> None:
        if not isinstance(d, dict) or d.get("version") != STATE_VERSION:
            raise ValueError(f"data stream state: unknown format/version {d.get('version')!r}")
        for key, mine in (
            ("split", self.split),
            ("seed", self.cfg.seed),
            ("shuffle", self.shuffle),
            ("n_shards", self.n_shards),
        ):
            if d.get(key) != mine:
                raise ValueError(
                    f"data stream state is for {key}={d.get(key)!r}, this stream has {mine!r}"
                )

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Continue from a state of :meth:`state_dict` (same world size, rank and workers) or
        of :meth:`merge_state_dicts` (any world size)."""
        self._check_common(d)
        if d.get("kind") == "rank":
            old = (d["world_size"], d["num_workers"])
            if old != (self.world_size, self.num_workers):
                raise ValueError(
                    f"data stream state is from world size {old[0]} x {old[1]} workers, this "
                    f"stream is world size {self.world_size} x {self.num_workers} workers: merge "
                    "all ranks' states with TokenBatchStream.merge_state_dicts first"
                )
            if d["rank"] != self.rank:
                raise ValueError(f"data stream state is of rank {d['rank']}, this is {self.rank}")
            self._positions = copy.deepcopy(d["workers"])
            self._next = int(d["next"]) % self.num_workers
            self._ctx.base = _base_from_json(d["base"])
            self._base_counters = copy.deepcopy(d["base_counters"])
            self._replay_windows_if_rebatched(d)
        elif d.get("kind") == "merged":
            old_slots = d["n_slots"]
            new_slots = self._ctx.n_slots
            if d["base"] and parts_for(self.n_shards, old_slots) != parts_for(
                self.n_shards, new_slots
            ):
                raise ValueError(
                    f"cannot continue the {self.split} epoch of world size {d['world_size']} on "
                    f"world size {self.world_size}: {self.n_shards} shards are split by sample "
                    f"across {old_slots} vs {new_slots} producer slots; resume at the next epoch"
                )
            self._ctx.base = _base_from_json(d["base"])
            self._positions = [_fresh_pos(int(d["epoch"])) for _ in range(self.num_workers)]
            self._next = 0
            self._base_counters = (
                copy.deepcopy(d["counters"]) if self.rank == 0 else _zero_counters()
            )
            self._replay_windows_if_rebatched(d)
        else:
            raise ValueError(f"data stream state: unknown kind {d.get('kind')!r}")
        self._last_epoch = min(p["epoch"] for p in self._positions)

    def load_state_dicts(self, states: list[dict[str, Any]]) -> None:
        """Resume from the states of *all* ranks of the previous run, whatever its world size:
        this rank's own state when the world (size and workers) is unchanged, else their merge.

        Convenience for a trainer that can read every old rank's state on every new rank.
        """
        if not states:
            raise ValueError("load_state_dicts: no states given")
        same = [
            s
            for s in states
            if s.get("kind") == "rank"
            and s.get("world_size") == self.world_size
            and s.get("num_workers") == self.num_workers
            and s.get("rank") == self.rank
        ]
        if len(same) == 1 and len(states) == self.world_size:
            self.load_state_dict(same[0])
        else:
            self.load_state_dict(self.merge_state_dicts(states))

    @staticmethod
    def merge_state_dicts(states: list[dict[str, Any]]) -> dict[str, Any]:
        """Merge the states of *all* ranks of one world into a world-size-free state.

        The result lists, per epoch still in progress, the finished units and the window
        position of the started ones; load it into every rank of the new world with
        :meth:`load_state_dict`.  Counters are summed (and restored on the new rank 0).
        """
        if not states:
            raise ValueError("merge_state_dicts: no states given")
        first = states[0]
        for s in states:
            if s.get("kind") != "rank" or s.get("version") != STATE_VERSION:
                raise ValueError("merge_state_dicts: expects states from state_dict()")
            for key in ("split", "seed", "shuffle", "n_shards", "world_size", "num_workers"):
                if s[key] != first[key]:
                    raise ValueError(
                        f"merge_state_dicts: ranks disagree on {key} ({s[key]!r} vs {first[key]!r})"
                    )
        ws, nw = first["world_size"], first["num_workers"]
        ranks = sorted(s["rank"] for s in states)
        if ranks != list(range(ws)):
            raise ValueError(
                f"merge_state_dicts: need the states of all {ws} ranks, got ranks {ranks}"
            )
        n_shards, seed, shuffle = first["n_shards"], first["seed"], first["shuffle"]
        n_slots = ws * nw
        old_base = _base_from_json(first["base"])
        positions: list[tuple[int, dict[str, Any]]] = []
        counters = _zero_counters()
        for s in sorted(states, key=lambda s: s["rank"]):
            for w, p in enumerate(s["workers"]):
                positions.append((s["rank"] * nw + w, p))
            for src in [s["base_counters"], *(p["counters"] for p in s["workers"])]:
                for k in COUNTERS:
                    counters[k] += src[k]
                counters["bad_shards"] += [
                    b for b in src["bad_shards"] if b not in counters["bad_shards"]
                ]
        lo = min(p["epoch"] for _, p in positions)
        hi = max([p["epoch"] for _, p in positions] + list(old_base))
        base: dict[int, dict[str, Any]] = {}
        for epoch in range(lo, hi + 1):
            ob = old_base.get(epoch, {"done": set(), "partial": {}})
            done = set(ob["done"])
            started: dict[str, tuple[int, int]] = {}
            for slot, p in positions:
                if p["epoch"] < epoch:
                    continue
                plan = slot_plan(n_shards, n_slots, slot, seed, epoch, shuffle, ob["done"])
                if p["epoch"] > epoch:
                    done.update(unit_key(u) for u in plan)
                    continue
                done.update(unit_key(u) for u in plan[: p["idx"]])
                if p["idx"] < len(plan) and p["ws"] >= 0:
                    started[unit_key(plan[p["idx"]])] = (p["ws"], p["bd"])
            partial = {k: v for k, v in ob["partial"].items() if k not in done}
            partial.update(started)
            if done or partial:
                base[epoch] = {"done": done, "partial": partial}
        return {
            "version": STATE_VERSION,
            "kind": "merged",
            "split": first["split"],
            "seed": seed,
            "shuffle": shuffle,
            "n_shards": n_shards,
            "world_size": ws,
            "n_slots": n_slots,
            "epoch": lo,
            "base": _base_to_json(base),
            "counters": counters,
            "batching": first.get("batching"),
        }
