"""Measured per-rank memory of the model states under ZeRO 0-3 against `paperscale plan`.

One `torchrun` per world size; each CPU rank builds the real engine for stages 0-3 in turn and
runs two optimizer steps on random tokens, and after every backward and step sums the bytes of
the tensor storages that are alive and were not before the engine (what the garbage collector
tracks, and what the optimizer and parameters reach: `.grad`, ZeRO 3's `ds_tensor`). The
largest sum is the measured resident memory of parameters, gradients, optimizer states and
persistent buffers; the prediction is launch.cost_model.plan's `resident` bytes plus the
module buffers. Transients inside backward/step are outside both. `bucket_elements` sets
train.bucket_elements for both (at the default, ZeRO 3's resident bucket would dwarf a small
model).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import CPU_ENV, Row, in_fresh_process, open_job, row
from launch.cost_model.plan import (
    ds_buckets,
    model_state_bytes,
    module_buffer_bytes,
    persistent_numel,
)
from model.config import ModelConfig
from model.loss import label_smoothed_loss
from model.params import count_parameters
from trainer.ds import config as ds_config
from trainer.ds.engine import build_engine

STAGES = (0, 1, 2, 3)
TOLERANCE = 0.20
SMOKE = [
    "model.d_model=64",
    "model.n_heads=2",
    "model.d_ff=256",
    "model.encoder_layers=2",
    "model.decoder_layers=2",
    "data.vocab_size=2000",
]


def _storages_of(obj: Any, out: dict[int, int], visited: set[int], depth: int = 0) -> None:
    """Add every tensor storage reachable from `obj` to `out` {data_ptr: nbytes}."""
    if id(obj) in visited or depth > 6:
        return
    visited.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.device.type != "meta":
            storage = obj.untyped_storage()
            out[storage.data_ptr()] = storage.nbytes()
        for attr in ("grad", "ds_tensor"):
            inner = getattr(obj, attr, None)
            if inner is not None:
                _storages_of(inner, out, visited, depth + 1)
        return
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(("deepspeed", "torch.optim")):
        items = list(vars(obj).values())
    else:
        return
    for item in items:
        _storages_of(item, out, visited, depth + 1)


def live_storages(*roots: Any) -> dict[int, int]:
    """{data_ptr: nbytes} of the tensors the garbage collector tracks and those under roots
    (objects frozen by gc.freeze(), all older than the engine, are not listed)."""
    gc.collect()
    out: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type != "meta":
            try:
                storage = obj.untyped_storage()
            except RuntimeError:
                continue
            out[storage.data_ptr()] = storage.nbytes()
    visited: set[int] = set()
    for root in roots:
        _storages_of(root, out, visited)
    return out


def new_bytes(engine: Any, exclude: set[int]) -> int:
    """Bytes of the live storages under `engine` (and tracked by gc) not in `exclude`."""
    live = live_storages(engine.optimizer, list(engine.module.parameters()))
    return sum(b for p, b in live.items() if p not in exclude and p != 0)


def measure_stage(job: Any, model_cfg: ModelConfig, env: Any, stage: int) -> tuple[float, str]:
    """The largest new resident bytes of `stage`'s engine in two steps, its optimizer class."""
    job.train.zero_stage = stage
    torch.manual_seed(1)
    vocab = model_cfg.vocab_size or 8
    src = torch.randint(4, vocab, (4, 16))  # (B, S)
    tgt = torch.randint(4, vocab, (4, 17))  # (B, T + 1)
    before = set(live_storages())
    gc.freeze()  # everything alive now is in `before`: the scans below skip it
    engine = build_engine(job, model_cfg, env)
    exclude = before | {t.untyped_storage().data_ptr() for t in (src, tgt)}
    peak = 0
    for _ in range(2 * job.train.grad_accum):
        loss, _, n = label_smoothed_loss(engine(src, tgt[:, :-1]), tgt[:, 1:], 0.1)
        engine.backward(loss / n)
        del loss, n
        # ZeRO 2's gradient reduce at the accumulation boundary is asynchronous under gloo: its
        # flat bucket and a partition-sized copy (1.24 MB on the smoke model) stay alive until
        # the peer has finished it too. Counted, they made 4 of 15 smoke runs read 1.27x; after
        # the barrier none of 11 did. They are transient, not model states the plan prices.
        torch.distributed.barrier()
        peak = max(peak, new_bytes(engine, exclude))
        engine.step()
        peak = max(peak, new_bytes(engine, exclude))
    optimizer = type(engine.optimizer).__name__
    engine.destroy()
    del engine
    gc.unfreeze()
    gc.collect()
    return float(peak), optimizer


def predicted_bytes(
    model_cfg: ModelConfig, stage: int, world: int, precision: str, train: Any
) -> float:
    """launch.cost_model.plan's resident model states plus module buffers for this rank, with
    the run's buckets (train.bucket_elements, train.overlap_comm) and gradient sums' dtype."""
    buckets = ds_buckets(train)
    fp32_sums = ds_config.fp32_sums(train)
    persistent = persistent_numel(model_cfg, buckets.persistence_threshold) if stage == 3 else 0
    n_params = count_parameters(model_cfg)["total"]
    states = model_state_bytes(n_params, stage, world, precision, buckets, persistent, fp32_sums)
    return states["resident"] + module_buffer_bytes(model_cfg)


def worker(config: str, bucket_elements: int, overrides: list[str]) -> list[Row]:
    """One rank under torchrun: every stage; its rows."""
    sized = [f"train.bucket_elements={bucket_elements}"] if bucket_elements else []
    job, env, model_cfg = open_job(config, ["logging.wandb=disabled", *sized, *overrides])
    world, precision = env.world_size, job.train.precision
    rows = []
    for stage in STAGES:
        measured, optimizer = measure_stage(job, model_cfg, env, stage)
        predicted = predicted_bytes(model_cfg, stage, world, precision, job.train)  # this stage
        case = {"world": world, "stage": stage, "measured": measured, "predicted": predicted,
                "optimizer": optimizer, "precision": precision, "config": config}  # fmt: skip
        label = f"measured / predicted, {world} rank(s), ZeRO {stage}"
        rows.append(row(label, measured / predicted, "x", **case))
    return rows


def measure(
    work: Path,
    config: str = "configs/base.yaml",
    worlds: Sequence[int] = (1, 2),
    bucket_elements: int = 0,
    timeout: float = 900.0,
    overrides: Sequence[str] = (),
    smoke: bool = False,
) -> list[Row]:
    """Every stage on each world size, one torchrun per world; `bucket_elements` 0 keeps
    trainer.ds.config's."""
    if smoke:
        # small buckets: two in flight at the end of a backward (overlap_comm) must not
        # outweigh the 2 bytes a parameter that ZeRO 1 saves on this small model
        config, bucket_elements, overrides = "configs/tiny.yaml", 20_000, [*SMOKE, *overrides]
    args = {"config": config, "bucket_elements": bucket_elements, "overrides": list(overrides)}
    rows: list[Row] = []
    for world in worlds:
        log = work / f"world{world}.log"
        rows += in_fresh_process("zero_memory:worker", args, log, CPU_ENV, timeout, ranks=world)
    worst = max(abs(r["value"] - 1) for r in rows)
    return [*rows, row("worst |measured / predicted - 1|", worst, "x", tolerance=TOLERANCE)]
