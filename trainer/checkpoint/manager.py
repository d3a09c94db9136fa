"""The checkpoint manager: saves and restores every registered piece of training state.

A checkpoint is DeepSpeed's engine files (model, optimizer partitions, LR scheduler), the
shared `TrainState` as DeepSpeed's client state (rank 0 writes it), one file per rank with the
per-rank states (data position, RNG), `meta.json` (model shape and resolved config, readable
without DeepSpeed), then the `complete` marker and `latest`:

    every rank: free-space check -> agree -> DeepSpeed files + own rank file (each fsynced)
             -> agree -> rank 0: meta.json, complete, latest (atomic) -> prune -> agree

A save interrupted anywhere leaves `latest` naming the previous complete checkpoint; one that
fails on any rank raises CheckpointError on all of them and removes its partial directory.
A background save (train.async_save) copies the files' state to host memory, writes them from a
thread, and is published (the second agreement on) by `publish` at a later step.
Observers (fault injection in the tests) hear when a save starts and after every file.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from trainer.checkpoint.background import BackgroundWrite, HostPool, QueuedWrites
from trainer.checkpoint.disk import (
    CheckpointError,
    RecordedWrites,
    agree,
    estimate_bytes,
    fsync_path,
    write_atomic,
    write_error,
)
from trainer.checkpoint.safe_load import forbid_code_in_checkpoints
from trainer.run_dir import CheckpointDir, tag_for
from trainer.state import RankStateful, TrainState

# what a first save is assumed to write per second (later saves use the measured time)
ASSUMED_WRITE_BYTES_S = 200e6
# lets ds_to_universal convert a checkpoint for another number of ranks
UNIVERSAL_INFO = {"universal_checkpoint_info": {"universal_checkpoint_version": 0.2}}


@dataclass
class Pending:
    """A background save whose files are being written."""

    tag: str
    step: int
    started: float
    writes: BackgroundWrite


class SaveObserver(Protocol):
    def save_started(self, step: int) -> None: ...

    def file_written(self, step: int) -> None: ...


class CheckpointManager:
    """Owns RUN/checkpoints for one rank: `save(step)` and `restore()` of the engine, the
    shared train state and the per-rank states registered by name."""

    def __init__(
        self,
        ckpts: CheckpointDir,
        engine: Any,
        rank: int,
        world_size: int,
        train_state: TrainState,
        per_rank: dict[str, RankStateful],
        *,
        keep_last: int,
        meta: dict[str, Any],
        precision: str,
        check_space: bool = True,
        observers: Sequence[SaveObserver] = (),
        host_group: Any = None,
    ) -> None:
        self.ckpts = ckpts
        self.engine = engine
        self.rank = rank
        self.world_size = world_size
        self.train_state = train_state
        self.per_rank = per_rank
        self.keep_last = keep_last
        self.meta = meta
        self.precision = precision
        self.check_space = check_space
        self.observers = list(observers)
        self.n_params = sum(p.numel() for p in engine.module.parameters())
        self.last_save_s: float | None = None  # how long the last save took on this rank
        self.last_stall_s: float | None = None  # how long it held the training loop up
        self.host_group = host_group  # a gloo group for host flags (None: the default group)
        self.pending: Pending | None = None  # a background save not yet published
        self.host_pool = HostPool()  # its host buffers, reused by the next one

    def rank_states(self) -> dict[str, dict[str, Any]]:
        """A snapshot of this rank's per-rank states (cheap: positions and generator states)."""
        return {name: s.state_dict() for name, s in self.per_rank.items()}

    def rewind(self, states: dict[str, dict[str, Any]]) -> None:
        """Put this rank's per-rank states back to a snapshot, e.g. the one taken when a step
        began that was then abandoned: the next save holds the last finished step."""
        for name, state in self.per_rank.items():
            state.load_state_dict(states[name])

    def expected_save_s(self) -> float:
        """Seconds the next save should take: the last one's time, else the checkpoint's
        estimated size at ASSUMED_WRITE_BYTES_S."""
        if self.last_save_s is not None:
            return self.last_save_s
        return (
            estimate_bytes(self.ckpts.root, self.n_params, self.precision) / ASSUMED_WRITE_BYTES_S
        )

    # -- saving ---------------------------------------------------------------------------

    def save(self, step: int, background: bool = False) -> str:
        """Save on every rank (all ranks call this at the same step); returns the tag.
        `background`: copy the state to host memory and return; the files are written by a
        thread and the checkpoint published by a later `publish` (trainer/checkpoint/background.py).
        A save still pending is published first."""
        self.publish(wait=True)
        started = time.monotonic()
        tag = tag_for(step)
        self._begin(tag, step)
        if background:
            self.pending = self._start_background(tag, step, started)
            self.last_stall_s = time.monotonic() - started
            return tag
        error = self._write_engine_and_rank_files(tag, step)
        self._complete(tag, step, error)
        self.last_save_s = self.last_stall_s = time.monotonic() - started
        return tag

    def publish(self, wait: bool) -> str | None:
        """The pending background save, published once every rank has written its files:
        its tag, or None while some rank still writes (`wait`: block until then) or when
        none is pending. All ranks call this at the same step (one host all-reduce)."""
        pending = self.pending
        if pending is None:
            return None
        if wait:
            pending.writes.wait()
        flag = torch.tensor([float(pending.writes.running())])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.host_group)
        if flag.item() > 0:
            return None
        self.pending = None
        self._complete(pending.tag, pending.step, pending.writes.error)
        self.last_save_s = time.monotonic() - pending.started
        return pending.tag

    def _start_background(self, tag: str, step: int, started: float) -> Pending:
        writes = BackgroundWrite(
            self.engine.checkpoint_engine.save, lambda: self._file_written(step), self.host_pool
        )
        client_state = {**self.train_state.state_dict(), **UNIVERSAL_INFO}
        with QueuedWrites(self.engine, writes):
            self.engine.save_checkpoint(
                str(self.ckpts.root), tag=tag, client_state=client_state, save_latest=False
            )
        writes.add({n: s.state_dict() for n, s in self.per_rank.items()},
                   self.ckpts.rank_file(tag, self.rank), atomic=True)  # fmt: skip
        writes.start()
        return Pending(tag, step, started, writes)

    def _begin(self, tag: str, step: int) -> None:
        self.ckpts.root.mkdir(parents=True, exist_ok=True)
        self._check_space(tag)
        for observer in self.observers:
            observer.save_started(step)
        if self.rank == 0:  # a marker left by an interrupted save of the same tag
            self.ckpts.complete_marker(tag).unlink(missing_ok=True)

    def _complete(self, tag: str, step: int, error: str | None) -> None:
        """Once every rank's files are written (or one failed): rank 0 publishes, or all raise
        and the partial directory is removed."""
        problems = agree(error is not None, error or "", self.engine.device)
        if not problems:
            error = self._mark_complete(tag, step) if self.rank == 0 else None
            problems = agree(error is not None, error or "", self.engine.device)
        if problems:
            if self.rank == 0 and self.ckpts.latest_tag() != tag:
                shutil.rmtree(self.ckpts.tag_dir(tag), ignore_errors=True)
            dist.barrier()
            raise CheckpointError(
                f"checkpoint {tag} not saved: {problems[0]}; the last complete checkpoint is "
                f"{self.last_complete()}"
            )

    def last_complete(self) -> str:
        return self.ckpts.latest_tag() or "none"

    def _check_space(self, tag: str) -> None:
        """Every rank checks its file system for room; all raise if any lacks it."""
        message = ""
        if self.check_space:
            need = estimate_bytes(self.ckpts.root, self.n_params, self.precision)
            free = shutil.disk_usage(self.ckpts.root).free
            if free < need:
                message = (
                    f"not saving checkpoint {tag}: it needs about {need / 2**20:.1f} MiB but "
                    f"{self.ckpts.root} has {free / 2**20:.1f} MiB free"
                )
        problems = agree(bool(message), message, self.engine.device)
        if problems:
            raise CheckpointError(f"{problems[0]}; the last complete checkpoint is "
                                  f"{self.last_complete()}")  # fmt: skip

    def _file_written(self, step: int) -> None:
        for observer in self.observers:
            observer.file_written(step)

    def _write_engine_and_rank_files(self, tag: str, step: int) -> str | None:
        """DeepSpeed's files and this rank's own file; the first failed write, or None."""
        client_state = {**self.train_state.state_dict(), **UNIVERSAL_INFO}
        with RecordedWrites(self.engine, lambda: self._file_written(step)) as writes:
            self.engine.save_checkpoint(
                str(self.ckpts.root), tag=tag, client_state=client_state, save_latest=False
            )
        if writes.error is not None:
            return writes.error
        path = self.ckpts.rank_file(tag, self.rank)
        tmp = path.with_suffix(".tmp")
        try:
            torch.save({name: s.state_dict() for name, s in self.per_rank.items()}, tmp)
            fsync_path(tmp)
            os.replace(tmp, path)
            fsync_path(self.ckpts.tag_dir(tag))
        except Exception as exc:
            tmp.unlink(missing_ok=True)
            return write_error(tmp, exc)
        self._file_written(step)
        return None

    def _mark_complete(self, tag: str, step: int) -> str | None:
        """Rank 0: meta.json, the `complete` marker, `latest`, then prune old checkpoints."""
        try:
            write_atomic(self.ckpts.meta_file(tag), json.dumps(self.meta, indent=1))
            self._file_written(step)
            write_atomic(self.ckpts.complete_marker(tag), f"{step}\n")
            self._file_written(step)
            write_atomic(self.ckpts.latest_file, tag + "\n")
            self._file_written(step)
        except Exception as exc:
            return write_error(self.ckpts.tag_dir(tag), exc)
        for old in self.ckpts.complete_tags()[: -self.keep_last]:
            shutil.rmtree(self.ckpts.tag_dir(old), ignore_errors=True)
        return None

    # -- restoring ------------------------------------------------------------------------

    def restore(self, tag: str) -> None:
        """Load the engine (model, optimizer, scheduler), the train state and every per-rank
        state from checkpoint `tag` (converted to the universal format beforehand when the
        world size changed: the engine was built with `load_universal`). Every file is read
        weights-only (trainer/checkpoint/safe_load.py), DeepSpeed's own loads included."""
        forbid_code_in_checkpoints()
        load_dir = self.ckpts.root
        if self.engine.load_universal_checkpoint():
            load_dir = self.ckpts.universal_root
        path, client_state = self.engine.load_checkpoint(
            str(load_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {self.ckpts.tag_dir(tag)}")
        self.train_state.load_state_dict(client_state or {})
        rank_states = [torch.load(f, weights_only=True) for f in self.ckpts.rank_files(tag)]
        for name, state in self.per_rank.items():
            state.load_rank_states([s[name] for s in rank_states], self.rank, self.world_size)


def saved_setting(ckpts: CheckpointDir, tag: str, section: str, key: str) -> Any:
    """A value of the resolved config a checkpoint was saved with (e.g. train.precision)."""
    return ckpts.read_meta(tag)["config"][section][key]


def export_source(ckpts: CheckpointDir) -> Path | None:
    """The checkpoint directory a finished run exports: the one `latest` names."""
    tag = ckpts.latest_tag()
    return None if tag is None else ckpts.tag_dir(tag)
