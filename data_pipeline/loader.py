"""Streams token-budget micro-batches from prepared shards to one rank, resumably.

How the units of a split are dealt to ranks and workers: data_pipeline/dealing.py. What one
producer does with its units (windows, batches, damage): data_pipeline/producer.py. How a
position is saved: data_pipeline/position.py; how it moves to another world size:
data_pipeline/resume.py.

Position and resume
-------------------
Each batch carries its producer's position after it (a `WorkerPosition`).  The main process
keeps, per worker, the position of the last batch it handed to the consumer (not what the
DataLoader prefetched) and which worker comes next: the DataLoader hands batches out round
robin over its workers, so rotating which DataLoader worker plays which logical worker
reproduces the order after a resume.  A resumed worker seeks to its unit and window (reading
past the earlier samples of the tar), rebuilds the window and drops the batches already
delivered.  Per epoch, ``samples_seen + samples_skipped_long + samples_skipped_corrupt``
equals the manifest's sample count of the split.
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from data_pipeline.batching import BATCHING_VERSION, Batch
from data_pipeline.config import DataConfig, resolved_store, resolved_workers
from data_pipeline.dealing import Dealing, parts_for
from data_pipeline.manifest import read_manifest
from data_pipeline.position import Counters, WorkerPosition, progress_from_json, progress_to_json
from data_pipeline.producer import ProducerContext, WorkerDataset, produce
from data_pipeline.read_ahead import ReadAhead
from data_pipeline.resume import READABLE_VERSIONS, STATE_VERSION, merge_states
from data_pipeline.worker_server import worker_context
from data_pipeline.worker_signals import ignore_stop_signals, stop_signals_held

log = logging.getLogger(__name__)

# The fault seam of a slow reader (tests, bench feed): seconds of sleep per window built.
SLOW_WINDOW_ENV = "PAPERSCALE_FAULT_SLOW_WINDOW_S"
DEFAULT_WINDOW = 1000  # window (samples) for bucketing when cfg.shuffle_buffer == 0
RECEIVER_JOIN_S = 10.0  # how long close() waits for a receiver thread (it takes milliseconds)
__all__ = ["Batch", "TokenBatchStream", "read_manifest"]


def _identity(x: Any) -> Any:
    return x


def _close_at_exit(stream: weakref.ref[TokenBatchStream]) -> None:
    if (alive := stream()) is not None:
        alive.close()


class TokenBatchStream:
    """Iterable of :class:`Batch` for one rank of one split (see the module docstring).

    ``epochs`` epochs from ``start_epoch`` (``None``: endless).  ``shuffle`` shuffles shards,
    windows and batch order; pairs longer than ``cfg.max_len`` are skipped on the training
    split only.  ``state_dict``/``load_state_dict`` save and restore the exact position as of
    the last batch the consumer received; :meth:`merge_state_dicts` carries it over to
    another world size (or worker count).  ``pin_memory`` hands out batches in page-locked
    memory (set it on CUDA after ``torch.cuda.set_device``, so ``to(non_blocking=True)``
    overlaps the copy). ``text``: batches carry their samples' text (default: on every split
    but ``train``, whose batches carry ids, lengths and keys only).
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
        text: bool | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        if problems := cfg.problems():
            raise ValueError("data config: " + "; ".join(f"{k} {v}" for k, v in problems))
        self.data_dir = Path(data_dir)
        self.manifest = read_manifest(self.data_dir)
        if split not in self.manifest["splits"]:
            raise ValueError(
                f"{self.data_dir}: split {split!r} not prepared "
                f"(have {', '.join(self.manifest['splits'])})"
            )
        self.split = split
        # `auto` outside a run's decisions: decided for this host (data_pipeline/config.py)
        self.cfg = replace(cfg, num_workers=resolved_workers(cfg.num_workers))
        self.rank = rank
        self.world_size = world_size
        self.shuffle, self.epochs = shuffle, epochs
        self.start_epoch = start_epoch
        self.pin_memory = pin_memory
        self.text = split != "train" if text is None else text
        self.num_workers = max(1, self.cfg.num_workers)  # logical producers per rank
        shards = self.manifest["splits"][split]["shards"]
        self.n_shards = len(shards)
        self._ctx = self._context(shards, epochs)
        self._positions = [WorkerPosition(start_epoch) for _ in range(self.num_workers)]
        self._next = 0
        self._base_counters = Counters()
        self._last_epoch = start_epoch
        self._closing: Any = None  # multiprocessing Event shared with the workers (see close)
        self._receivers: list[ReadAhead] = []  # the threads receiving batches ahead (prefetch)

    def _context(self, shards: list[dict[str, Any]], epochs: int | None) -> ProducerContext:
        """What every producer of this stream needs (see data_pipeline/producer.py)."""
        cfg = self.cfg
        window = cfg.shuffle_buffer if cfg.shuffle_buffer > 0 else DEFAULT_WINDOW
        return ProducerContext(
            data_dir=str(self.data_dir),
            split=self.split,
            shards=[{k: s[k] for k in ("name", "samples", "packed") if k in s} for s in shards],
            dtype=self.manifest["dtype"],
            vocab_size=self.manifest["vocab_size"],
            max_tokens=cfg.max_tokens,
            max_len=cfg.max_len,
            pad_multiple=cfg.pad_multiple,
            bucket_width=cfg.bucket_width,
            batch_multiple=cfg.batch_multiple,
            window=window,
            shuffle=self.shuffle,
            skip_long=self.split == "train",
            seed=cfg.seed,
            dealing=Dealing(
                shard_samples=tuple(int(s["samples"]) for s in shards),
                n_slots=self.world_size * self.num_workers,
                seed=cfg.seed,
                shuffle=self.shuffle,
                block=window,  # one shuffle window per block
            ),
            slot0=self.rank * self.num_workers,
            end_epoch=None if epochs is None else self.start_epoch + epochs,
            text=self.text,
            read_ahead=cfg.read_ahead,
            store=resolved_store(cfg.store, shards, self.text),
            slow_window_s=float(os.environ.get(SLOW_WINDOW_ENV) or 0),
        )

    def close(self) -> None:
        """Stop the threads receiving batches ahead and wait for them, and let this stream's
        loader workers end on the TERM that shuts them down (they ignore TERM until then: see
        data_pipeline/producer.py). Called when the rank is done with the stream, and at its
        exit; the position stays readable. A receiver thread still running when the interpreter
        finalises can be ended inside torch's C++ code, which aborts the process: it is joined."""
        for receiver in self._receivers:
            receiver.close(join_s=RECEIVER_JOIN_S)
        self._receivers.clear()
        if self._closing is not None:
            self._closing.set()

    def _closing_event(self) -> Any:
        if self._closing is None:
            self._closing = worker_context().Event()
            # closed at exit before multiprocessing TERMs the workers; freed unclosed: they end
            atexit.register(_close_at_exit, weakref.ref(self))
            weakref.finalize(self, self._closing.set)
        return self._closing

    # -- iteration ---------------------------------------------------------------------------

    def _worker_loader(self, positions: list[WorkerPosition]) -> DataLoader:
        """A DataLoader whose `num_workers` workers produce from `positions` on."""
        return DataLoader(
            WorkerDataset(self._ctx, positions, self._next, self._closing_event()),
            batch_size=None,
            num_workers=self.cfg.num_workers,
            collate_fn=_identity,
            worker_init_fn=ignore_stop_signals,
            multiprocessing_context=worker_context(),
            prefetch_factor=2,
            pin_memory=self.pin_memory,
            # Its own generator: creating the iterator must not draw from the global torch
            # RNG, which the trainer restores on resume (dropout must continue exactly).
            generator=torch.Generator().manual_seed(self.cfg.seed),
        )

    def __iter__(self) -> Iterator[Batch]:
        """Batches from the current position on (a new iterator continues where the last
        delivered batch left off)."""
        positions = [p.copy() for p in self._positions]
        receiver = None
        if self.cfg.num_workers == 0:
            items: Any = produce(self._ctx, 0, self._ctx.slot0, positions[0])
        else:
            # the workers start, and the closing Event registers with the resource tracker
            with stop_signals_held():
                items = iter(self._worker_loader(positions))
            if self.cfg.prefetch > 0:
                # received ahead in a thread; a position counts only once handed out below
                receiver = ReadAhead(items, self.cfg.prefetch, lambda _: True)
                self._receivers.append(receiver)
                items = iter(receiver)
        try:
            yield from self._hand_out(items)
        finally:
            if receiver is not None:
                receiver.close()
                if receiver in self._receivers:  # not already closed by close()
                    self._receivers.remove(receiver)

    def _hand_out(self, items: Iterator[Any]) -> Iterator[Batch]:
        for item in items:
            self._positions[item.worker] = item.pos
            self._next = (item.worker + 1) % self.num_workers
            if item.batch is None:
                continue
            if self.pin_memory and self.cfg.num_workers == 0:
                item = item.pin_memory()
            self._last_epoch = item.pos.epoch
            yield item.batch

    # -- counters ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters as of the last delivered batch, summed over this rank's workers.

        ``epoch``: the epoch the slowest worker is in (== the end epoch once finished);
        ``worker_epochs`` per worker.
        """
        total = Counters.total([self._base_counters, *(p.counters for p in self._positions)])
        out: dict[str, Any] = total.to_dict()
        out["epoch"] = min(p.epoch for p in self._positions)
        out["worker_epochs"] = [p.epoch for p in self._positions]
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
            "shard_samples": list(self._ctx.dealing.shard_samples),
            "block": self._ctx.dealing.block,
            "world_size": self.world_size,
            "rank": self.rank,
            "num_workers": self.num_workers,
            "workers": [p.to_dict() for p in self._positions],
            "next": self._next,
            "base": progress_to_json(self._ctx.base),
            "base_counters": self._base_counters.to_dict(),
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
            p.batches_done = 0
        for progress in self._ctx.base.values():
            progress.replay_windows()

    def _check_common(self, d: dict[str, Any]) -> None:
        if not isinstance(d, dict) or d.get("version") not in READABLE_VERSIONS:
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
        saved = d.get("shard_samples")
        if saved is not None and tuple(saved) != self._ctx.dealing.shard_samples:
            raise ValueError(
                "data stream state is for shards of other sizes than this data dir's manifest"
            )

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Continue from a state of :meth:`state_dict` (same world size, rank and workers) or
        of :meth:`merge_state_dicts` (any world size)."""
        self._check_common(d)
        # Units are dealt as the saved run dealt them: its block size, or whole shards for a
        # state saved before blocks.
        self._ctx.dealing = replace(self._ctx.dealing, block=d.get("block"))
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
            self._positions = [WorkerPosition.from_dict(w) for w in d["workers"]]
            self._next = int(d["next"]) % self.num_workers
            self._ctx.base = progress_from_json(d["base"])
            self._base_counters = Counters.from_dict(d["base_counters"])
            self._replay_windows_if_rebatched(d)
        elif d.get("kind") == "merged":
            old_slots = d["n_slots"]
            new_slots = self._ctx.dealing.n_slots
            if d["base"] and parts_for(self.n_shards, old_slots) != parts_for(
                self.n_shards, new_slots
            ):
                raise ValueError(
                    f"cannot continue the {self.split} epoch of world size {d['world_size']} on "
                    f"world size {self.world_size}: {self.n_shards} shards are split by sample "
                    f"across {old_slots} vs {new_slots} producer slots; resume at the next epoch"
                )
            self._ctx.base = progress_from_json(d["base"])
            self._positions = [WorkerPosition(int(d["epoch"])) for _ in range(self.num_workers)]
            self._next = 0
            self._base_counters = (
                Counters.from_dict(d["counters"]) if self.rank == 0 else Counters()
            )
            self._replay_windows_if_rebatched(d)
        else:
            raise ValueError(f"data stream state: unknown kind {d.get('kind')!r}")
        self._last_epoch = min(p.epoch for p in self._positions)

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
        """Merge the states of *all* ranks of one world into a world-size-free state
        (data_pipeline/resume.py); load it into every rank of the new world with
        :meth:`load_state_dict`.  Counters are summed (and restored on the new rank 0)."""
        return merge_states(states)
