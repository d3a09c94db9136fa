"""Checkpoints: DeepSpeed's engine files plus our client state, `latest` written last.

Layout of `RUN/checkpoints/`:
  step_00000100/            DeepSpeed's files (model states, per-rank optimizer partitions)
  step_00000100/rank_00000.pt   this rank's own state: data position and RNG states
  latest                    the tag of the newest complete checkpoint (tmp file + rename)

`latest` is replaced only after every rank has finished writing, so a save interrupted at any
point leaves the previous checkpoint as the one resumed from.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainer.faults import Faults

LATEST = "latest"
META = "meta.json"


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def step_of(tag: str) -> int:
    return int(tag.split("_", 1)[1])


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file, fsync it and rename it over `path`."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def latest_tag(ckpt_dir: Path) -> str | None:
    """The tag `latest` names, if that checkpoint directory exists."""
    path = ckpt_dir / LATEST
    if not path.is_file():
        return None
    tag = path.read_text().strip()
    return tag if tag and (ckpt_dir / tag).is_dir() else None


def complete_tags(ckpt_dir: Path) -> list[str]:
    """Tags of finished checkpoints, oldest first (a tag is finished when its marker exists)."""
    if not ckpt_dir.is_dir():
        return []
    tags = [p.name for p in ckpt_dir.iterdir() if p.is_dir() and (p / "complete").is_file()]
    return sorted(tags, key=step_of)


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch generator states in a form `torch.load(weights_only=True)` reads."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def rank_state_path(ckpt_dir: Path, tag: str, rank: int) -> Path:
    return ckpt_dir / tag / f"rank_{rank:05d}.pt"


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
    tags = complete_tags(ckpt_dir)
    if tags:
        return checkpoint_bytes(ckpt_dir / tags[-1])
    per_param = {"fp32": 4 + 8, "bf16": 2 + 4 + 8, "fp16": 2 + 4 + 8}[precision]
    return int(n_params * per_param * 1.1) + 2**16


def _agree(failed: bool, message: str, device: Any) -> list[str]:
    """Every rank's message where any rank failed (all ranks call this; one collective on
    success, two on failure)."""
    flag = torch.tensor([float(failed)], device=device)
    dist.all_reduce(flag)
    if flag.item() == 0:
        return []
    messages: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(messages, message if failed else "")
    return [m for m in messages if m]


class _RecordedWrites:
    """DeepSpeed's checkpoint engine, made to fsync each file it writes and to record (not
    raise) a failed write, so that every rank still reaches DeepSpeed's own barriers and the
    ranks can agree on the failure afterwards."""

    def __init__(self, engine: Any, on_file: Callable[[], None]) -> None:
        self.ckpt_engine = engine.checkpoint_engine
        self.original = self.ckpt_engine.save
        self.on_file = on_file
        self.error: str | None = None

    def __enter__(self) -> _RecordedWrites:
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


def save(
    engine: Any,
    ckpt_dir: Path,
    step: int,
    client_state: dict[str, Any],
    rank_state: dict[str, Any],
    rank: int,
    keep_last: int,
    meta: dict[str, Any],
    *,
    n_params: int = 0,
    precision: str = "fp32",
    check_space: bool = True,
    faults: Faults | None = None,
) -> str:
    """Save on every rank; then rank 0 marks it complete, points `latest` at it and prunes.

    `meta` (model shape and resolved config, JSON) goes to `meta.json`, readable without
    DeepSpeed or unpickling. Before writing, every rank checks that its file system has room
    for a checkpoint as large as the last one; every file is fsynced before the `complete`
    marker. A save that cannot start or finish on any rank raises CheckpointError on all of
    them, removes its partial directory and leaves `latest` as it was.
    """
    faults = faults or Faults()
    tag = tag_for(step)
    tag_dir = ckpt_dir / tag
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    device = engine.device
    message = ""
    if check_space and not faults.skip_space_check:
        need = estimate_bytes(ckpt_dir, n_params, precision)
        free = shutil.disk_usage(ckpt_dir).free
        if free < need:
            message = (
                f"not saving checkpoint {tag}: it needs about {need / 2**20:.1f} MiB but "
                f"{ckpt_dir} has {free / 2**20:.1f} MiB free"
            )
    problems = _agree(bool(message), message, device)
    if problems:
        raise CheckpointError(f"{problems[0]}; the last complete checkpoint is {_last(ckpt_dir)}")

    faults.save_started(step)
    if rank == 0:  # a marker left by an interrupted save of the same tag
        (tag_dir / "complete").unlink(missing_ok=True)
    with _RecordedWrites(engine, lambda: faults.file_written(step)) as writes:
        engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
    error = writes.error
    if error is None:
        path = rank_state_path(ckpt_dir, tag, rank)
        tmp = path.with_suffix(".tmp")
        try:
            torch.save(rank_state, tmp)
            fsync_path(tmp)
            os.replace(tmp, path)
            fsync_path(tag_dir)
            faults.file_written(step)
        except Exception as exc:
            error = write_error(tmp, exc)
            tmp.unlink(missing_ok=True)
    problems = _agree(error is not None, error or "", device)
    if not problems and rank == 0:
        try:
            write_atomic(tag_dir / META, json.dumps(meta, indent=1))
            faults.file_written(step)
            write_atomic(tag_dir / "complete", f"{step}\n")
            faults.file_written(step)
            write_atomic(ckpt_dir / LATEST, tag + "\n")
            faults.file_written(step)
        except Exception as exc:
            error = write_error(ckpt_dir / tag, exc)
        if error is None:
            for old in complete_tags(ckpt_dir)[:-keep_last]:
                shutil.rmtree(ckpt_dir / old, ignore_errors=True)
    if not problems:
        problems = _agree(error is not None, error or "", device)
    if problems:
        if rank == 0 and latest_tag(ckpt_dir) != tag:
            shutil.rmtree(tag_dir, ignore_errors=True)
        dist.barrier()
        raise CheckpointError(
            f"checkpoint {tag} not saved: {problems[0]}; the last complete checkpoint is "
            f"{_last(ckpt_dir)}"
        )
    return tag


def _last(ckpt_dir: Path) -> str:
    return latest_tag(ckpt_dir) or "none"


def load(
    engine: Any, ckpt_dir: Path, tag: str, rank: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Load engine, optimizer and scheduler states.

    Returns (client_state, every saving rank's own state in rank order): a resumed rank needs
    all of them when the world size changed (the data position is re-dealt across ranks).
    """
    load_dir = ckpt_dir
    if engine.load_universal_checkpoint():
        load_dir = ckpt_dir / UNIVERSAL
    path, client_state = engine.load_checkpoint(
        str(load_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
    )
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {ckpt_dir / tag}")
    files = sorted((ckpt_dir / tag).glob("rank_*.pt"))
    rank_states = [torch.load(f, weights_only=True) for f in files]
    return client_state or {}, rank_states


UNIVERSAL = "universal"


def saved_world_size(ckpt_dir: Path, tag: str) -> int:
    """How many ranks wrote checkpoint `tag` (one rank-state file each)."""
    return len(list((ckpt_dir / tag).glob("rank_*.pt")))


def saved_meta(ckpt_dir: Path, tag: str) -> dict[str, Any]:
    return json.loads((ckpt_dir / tag / META).read_text())


def accumulation_for(old_accum: int, old_world: int, new_world: int) -> int:
    """Accumulation that keeps the global batch (accum x world) of the saving run."""
    total = old_accum * old_world
    if total % new_world:
        raise ValueError(
            f"cannot keep the global batch of {old_world} ranks x {old_accum} accumulation "
            f"on {new_world} ranks: {total} micro-batches per step is not divisible by {new_world}"
        )
    return total // new_world


def ensure_universal(ckpt_dir: Path, tag: str) -> Path:
    """Convert `tag` to DeepSpeed's universal format (once; rank 0 only) and return the
    directory to pass to `load_checkpoint` with `load_universal` on.

    A universal checkpoint stores every parameter's fp32 weights and optimizer moments whole,
    so a run saved on N ranks can continue on M. The conversion writes to a temporary
    directory renamed into place, so an interrupted one is redone, never half-used.
    """
    root = ckpt_dir / UNIVERSAL
    out = root / tag
    if not (out / "complete").is_file():
        tmp = root / f".{tag}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "trainer.safe_load", "deepspeed.checkpoint.ds_to_universal",
            "--input_folder", str(ckpt_dir / tag), "--output_folder", str(tmp),
            "--num_extract_workers", "1", "--num_merge_workers", "1",
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise RuntimeError(f"universal conversion of {ckpt_dir / tag} failed: {tail}")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        write_atomic(out / "complete", tag + "\n")
    return root
