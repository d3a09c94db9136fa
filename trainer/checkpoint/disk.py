"""The mechanics of a checkpoint on disk: durable writes, the free-space check, the ranks'
agreement on a failed save, DeepSpeed's file writer made to fsync, and universal conversion.

The checkpoint manager (trainer/checkpoint/manager.py) uses these to save and restore; the names of
the files are the layout's (trainer/run_dir.py).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.run_dir import CheckpointDir, write_atomic


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; `str()` is one line. Every rank raises it together."""


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def write_error(path: Path, exc: BaseException) -> str:
    """One line for a failed write; a full file system is named as such (torch.save reports
    it as an internal assertion of its zip writer)."""
    try:
        free = shutil.disk_usage(path.parent if path.parent.exists() else path).free
    except OSError:
        free = -1
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or 0 <= free < 2**20:
        return f"{path}: No space left on device ({free / 2**20:.2f} MiB free)"
    return f"{path}: {_one_line(exc)}"


def checkpoint_bytes(tag_dir: Path) -> int:
    return sum(p.stat().st_size for p in tag_dir.iterdir() if p.is_file())


def estimate_bytes(ckpt_dir: Path, n_params: int, precision: str) -> int:
    """Size of the next checkpoint: the last complete one's, else from the model's size.

    Per parameter: the weights in the training precision, fp32 master weights (bf16/fp16) and
    Adam's two fp32 moments; 10% and 64 KiB on top for the rest.
    """
    tags = CheckpointDir(ckpt_dir).complete_tags()
    if tags:
        return checkpoint_bytes(ckpt_dir / tags[-1])
    per_param = {"fp32": 4 + 8, "bf16": 2 + 4 + 8, "fp16": 2 + 4 + 8}[precision]
    return int(n_params * per_param * 1.1) + 2**16


def agree(failed: bool, message: str, device: Any) -> list[str]:
    """Every rank's message where any rank failed (all ranks call this; one collective on
    success, two on failure)."""
    flag = torch.tensor([float(failed)], device=device)
    dist.all_reduce(flag)
    if flag.item() == 0:
        return []
    messages: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(messages, message if failed else "")
    return [m for m in messages if m]


class RecordedWrites:
    """DeepSpeed's checkpoint engine, made to fsync each file it writes and to record (not
    raise) a failed write, so that every rank still reaches DeepSpeed's own barriers and the
    ranks can agree on the failure afterwards."""

    def __init__(self, engine: Any, on_file: Callable[[], None]) -> None:
        self.ckpt_engine = engine.checkpoint_engine
        self.original = self.ckpt_engine.save
        self.on_file = on_file
        self.error: str | None = None

    def __enter__(self) -> RecordedWrites:
        def save(state_dict: Any, path: str) -> None:
            if self.error is not None:
                return
            try:
                self.original(state_dict, path)
                fsync_path(Path(path))
            except Exception as exc:  # ENOSPC surfaces as OSError or torch's RuntimeError
                self.error = write_error(Path(path), exc)
                Path(path).unlink(missing_ok=True)
                return
            self.on_file()

        self.ckpt_engine.save = save
        return self

    def __exit__(self, *exc: object) -> None:
        self.ckpt_engine.save = self.original


def saved_world_size(ckpt_dir: Path, tag: str) -> int:
    """How many ranks wrote checkpoint `tag` of RUN/checkpoints `ckpt_dir`."""
    return CheckpointDir(ckpt_dir).saved_world_size(tag)


def accumulation_for(old_accum: int, old_world: int, new_world: int) -> int:
    """Accumulation that keeps the global batch (accum x world) of the saving run."""
    total = old_accum * old_world
    if total % new_world:
        raise ValueError(
            f"cannot keep the global batch of {old_world} ranks x {old_accum} accumulation "
            f"on {new_world} ranks: {total} micro-batches per step is not divisible by {new_world}"
        )
    return total // new_world


def ensure_universal(ckpts: CheckpointDir, tag: str) -> Path:
    """Convert `tag` to DeepSpeed's universal format (once; rank 0 only) and return the
    directory to pass to `load_checkpoint` with `load_universal` on.

    A universal checkpoint stores every parameter's fp32 weights and optimizer moments whole,
    so a run saved on N ranks can continue on M. The conversion writes to a temporary
    directory renamed into place, so an interrupted one is redone, never half-used.
    """
    root = ckpts.universal_root
    out = CheckpointDir(root)
    if not out.is_complete(tag):
        tmp = root / f".{tag}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "trainer.checkpoint.safe_load",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder", str(ckpts.tag_dir(tag)), "--output_folder", str(tmp),
            "--num_extract_workers", "1", "--num_merge_workers", "1",
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise RuntimeError(f"universal conversion of {ckpts.tag_dir(tag)} failed: {tail}")
        shutil.rmtree(out.tag_dir(tag), ignore_errors=True)
        os.replace(tmp, out.tag_dir(tag))
        write_atomic(out.complete_marker(tag), tag + "\n")
    return root
