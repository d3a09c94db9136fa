"""Checkpoint size and save / load time of a preset against `paperscale plan`'s estimate of both.

Under torchrun (every rank writes its partition). One optimizer step fills the Adam moments;
the real save path (CheckpointManager.save) is timed, and the restore. Then background and
synchronous saves alternate: the stall (until `save` returns) and the time to publish against a
synchronous save, best of each (the host buffers reused, as in a run). The engine is in the
precision a training run would settle on.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.common import Row, open_job, row
from launch.cost_model.save import save_plan
from model.config import ModelConfig
from model.loss import label_smoothed_loss
from trainer.checkpoint.manager import CheckpointManager
from trainer.ds.engine import build_engine
from trainer.run_dir import RunDir
from trainer.state import RngState, TrainState


@dataclass(frozen=True)
class SaveTimes:
    """Seconds of the timed saves (the async and synchronous ones: the best) and the restore."""

    saved: float  # the first synchronous save
    loaded: float  # the restore after the saves
    stall: float  # a background save: until `save` returns
    total: float  # a background save: until the checkpoint is published
    sync: float  # a synchronous save, best of the side by side


def trained_engine(job: Any, model_cfg: ModelConfig, env: Any) -> Any:
    """The preset's engine after one optimizer step on random tokens (Adam's moments filled)."""
    torch.manual_seed(job.train.seed)
    engine = build_engine(job, model_cfg, env)
    vocab = model_cfg.vocab_size
    src = torch.randint(4, vocab, (8, 32))  # (B, S)
    tgt = torch.randint(4, vocab, (8, 33))  # (B, T + 1)
    for _ in range(job.train.grad_accum):
        loss, _, n = label_smoothed_loss(engine(src, tgt[:, :-1]), tgt[:, 1:], 0.1)
        engine.backward(loss / n)
        engine.step()
    return engine


def time_saves(manager: CheckpointManager, rounds: int) -> tuple[str, SaveTimes]:
    """A synchronous save, background and synchronous ones in turn, the restore of the last."""
    dist.barrier()
    start = time.perf_counter()
    tag = manager.save(1)
    saved = time.perf_counter() - start
    stalls, totals, syncs = [], [], [saved]
    for i in range(rounds):  # side by side: background, then synchronous
        dist.barrier()
        start = time.perf_counter()
        manager.save(2 + 2 * i, background=True)
        stalls.append(time.perf_counter() - start)  # what the training loop waits for
        manager.publish(wait=True)
        totals.append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        tag = manager.save(3 + 2 * i)
        syncs.append(time.perf_counter() - start)
    stall, total, sync = min(stalls), min(totals), min(syncs)
    start = time.perf_counter()
    manager.restore(tag)
    dist.barrier()
    loaded = time.perf_counter() - start
    return tag, SaveTimes(saved, loaded, stall, total, sync)


def checkpoint_rows(
    config: str, job: Any, env: Any, engine: Any, tag_dir: Path, t: SaveTimes
) -> list[Row]:
    """The checkpoint in `tag_dir`, its times, and `paperscale plan`'s estimate (one node)."""
    files = [p for p in tag_dir.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    params = sum(p.numel() for p in engine.module.parameters())
    plan = save_plan(params, job.train.zero_stage, env.world_size, env.world_size,
                     job.train.precision)  # fmt: skip
    case = {
        "config": config,
        "parameters": params,
        "ranks": env.world_size,
        "zero_stage": job.train.zero_stage,
        "precision": job.train.precision,
    }
    return [
        row("checkpoint size", size / 2**20, "MiB", files=len(files), **case),
        row("bytes per parameter", size / params, "bytes", **case),
        row("save", t.saved, "s", **case),
        row("save rate", size / 2**20 / t.saved, "MiB/s", **case),
        row("load", t.loaded, "s", **case),
        row("plan checkpoint size", plan.total_bytes / 2**20, "MiB", **case),
        row("plan save estimate", plan.seconds, "s", write_gbs=plan.write_gbs, **case),
        row("measured save / plan estimate", t.saved / plan.seconds, "x", **case),
        row("synchronous save (best of the side by side)", t.sync, "s", **case),
        row("async save: stall", t.stall, "s", **case),
        row("async save: written and published", t.total, "s", **case),
        row("async stall / synchronous save", t.stall / t.sync, "x", **case),
    ]


def measure(
    work: Path, config: str = "configs/base.yaml", overrides: Sequence[str] = (), rounds: int = 3
) -> list[Row]:
    """Time the saves (`rounds` background / synchronous pairs after the first) and the restore
    on every rank, in rank 0's `work`; rank 0's rows."""
    job, env, model_cfg = open_job(config, overrides)
    engine = trained_engine(job, model_cfg, env)

    # as the training loop does once set up (trainer/loop.py): what lives for the whole run is
    # left out of the garbage collector's scans, so no full collection (~0.5 s over the ~400k
    # objects of torch and DeepSpeed) lands inside a timed save, as none does in a run
    gc.freeze()
    shared = [str(work / "ckpt")]
    dist.broadcast_object_list(shared, src=0)  # rank 0's directory for every rank
    ckpts = RunDir(Path(shared[0])).checkpoints
    manager = CheckpointManager(
        ckpts, engine, env.rank, env.world_size, TrainState(step=1), {"rng": RngState()},
        keep_last=1, meta={"model": model_cfg.__dict__, "config": {}},
        precision=job.train.precision,
    )  # fmt: skip
    tag, times = time_saves(manager, rounds)
    rows = (
        checkpoint_rows(config, job, env, engine, ckpts.tag_dir(tag), times) if env.is_main else []
    )
    dist.barrier()
    return rows
