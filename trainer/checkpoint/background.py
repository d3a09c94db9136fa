"""Checkpoint files written in the background (train.async_save).

At a step boundary every state DeepSpeed and the checkpoint manager would write is copied to
host memory (`host_copy`: each tensor once, views and shared storage kept apart by their
storage, containers rebuilt, other leaves are immutable values); one thread per save then
writes those copies in the order a synchronous save would, each file fsynced, while training
goes on. The manager publishes the checkpoint (meta.json, `complete`, `latest`) only after
every rank has reported its files written, so a crash or kill during the background write
leaves the previous checkpoint as `latest`, exactly as an interrupted synchronous save does.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint.disk import fsync_path, write_error


def _storage_key(t: torch.Tensor) -> tuple[Any, ...]:
    return (
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
    )


class HostPool:
    """Host buffers kept from one background save to the next: a copy into memory that was
    written before is several times faster than into fresh pages (on a GPU node they are
    pinned, so the device-to-host copies run at full speed)."""

    def __init__(self) -> None:
        self.free: dict[tuple[Any, ...], list[torch.Tensor]] = {}

    def take(self, like: torch.Tensor) -> torch.Tensor:
        key = (tuple(like.shape), like.dtype)
        if self.free.get(key):
            return self.free[key].pop()
        return torch.empty(like.shape, dtype=like.dtype, pin_memory=like.is_cuda)

    def give_back(self, buffers: list[torch.Tensor]) -> None:
        for buf in buffers:
            self.free.setdefault((tuple(buf.shape), buf.dtype), []).append(buf)


def host_copy(
    obj: Any,
    memo: dict[tuple[Any, ...], torch.Tensor] | None = None,
    pool: HostPool | None = None,
) -> Any:
    """`obj` with every tensor copied to host memory (a tensor seen twice, e.g. a tied
    weight's two names, is copied once and stays shared; views become compact tensors);
    dicts, lists and tuples rebuilt. Buffers come from `pool` when given."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        key = _storage_key(obj)
        if key not in memo:
            src = obj.detach()
            buf = (pool or HostPool()).take(src)
            memo[key] = buf.copy_(src, non_blocking=src.is_cuda)
        return memo[key]
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) is not dict else {}
        for k, v in obj.items():
            out[k] = host_copy(v, memo, pool)
        return out
    if isinstance(obj, list):
        return [host_copy(v, memo, pool) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(host_copy(v, memo, pool) for v in obj)
    return obj


class BackgroundWrite:
    """The files of one save on this rank, copied now and written by one thread later."""

    def __init__(
        self, write: Callable[[Any, str], None], on_file: Callable[[], None], pool: HostPool
    ) -> None:
        self.write = write  # DeepSpeed's own checkpoint-engine save (torch.save)
        self.on_file = on_file
        self.pool = pool
        self.memo: dict[tuple[Any, ...], torch.Tensor] = {}
        self.items: list[tuple[Any, Path, bool]] = []
        self.error: str | None = None
        self.copy_s = 0.0  # time spent copying the state (the stall of the training loop)
        self.write_s = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="checkpoint-write")

    def add(self, state: Any, path: str | Path, atomic: bool = False) -> None:
        """Queue a copy of `state` for `path` (`atomic`: through a temporary file)."""
        started = time.perf_counter()
        self.items.append((host_copy(state, self.memo, self.pool), Path(path), atomic))
        self.copy_s += time.perf_counter() - started

    def start(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non-blocking device-to-host copies have landed
        self._thread.start()

    def running(self) -> bool:
        return self._thread.ident is not None and not self._done.is_set()

    def wait(self) -> None:
        if self._thread.ident is not None:
            self._thread.join()

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            for state, path, atomic in self.items:
                target = path.with_suffix(".tmp") if atomic else path
                try:
                    self.write(state, str(target))
                    fsync_path(target)
                    if atomic:
                        os.replace(target, path)
                        fsync_path(path.parent)
                except Exception as exc:  # ENOSPC surfaces as OSError or torch's RuntimeError
                    self.error = write_error(target, exc)
                    target.unlink(missing_ok=True)
                    return
                self.on_file()
        finally:
            self.items = []
            self.pool.give_back(list(self.memo.values()))  # for the next save to reuse
            self.memo = {}
            self.write_s = time.perf_counter() - started
            self._done.set()


class QueuedWrites:
    """DeepSpeed's checkpoint engine made to queue copies of what it would write. It also
    says that it does not keep storage sharing, so DeepSpeed hands over its tensors without
    first cloning them on the device (`host_copy` is then the only copy)."""

    def __init__(self, engine: Any, writes: BackgroundWrite) -> None:
        self.ckpt_engine = engine.checkpoint_engine
        self.original = self.ckpt_engine.save
        self.original_sharing = self.ckpt_engine.preserves_storage_sharing
        self.writes = writes

    def __enter__(self) -> QueuedWrites:
        def save(state_dict: Any, path: str) -> None:  # DeepSpeed passes both by keyword too
            self.writes.add(state_dict, path)

        self.ckpt_engine.save = save
        self.ckpt_engine.preserves_storage_sharing = lambda: False
        return self

    def __exit__(self, *exc: object) -> None:
        self.ckpt_engine.save = self.original
        self.ckpt_engine.preserves_storage_sharing = self.original_sharing
