"""What a run settles before its first step: every `auto` (trainer/autos.py), the
accumulation when resuming on another number of ranks, and the peak FLOP/s for MFU.

Each returns new values (a new job, a new resolved config) rather than changing its inputs.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from data_pipeline.manifest import tokenizer_path
from data_pipeline.tokenizer import Tokenizer
from model.config import ModelConfig
from trainer import autos
from trainer.checkpoint.disk import accumulation_for, ensure_universal
from trainer.checkpoint.manager import saved_setting
from trainer.dist import DistEnv
from trainer.ds.engine import PRECISION_DTYPES, Job, resolve_model_config
from trainer.flops import peak_flops
from trainer.machine_cache import machine_key
from trainer.metrics import stderr_warn
from trainer.precision import PrecisionChoice, slow_bf16_warning
from trainer.run_dir import RunDir


class PrecisionError(ValueError):
    """The checkpoint's precision cannot run on this machine (e.g. fp16 without a GPU)."""


@dataclass(frozen=True)
class SettledJob:
    """The job as this run trains it, and what was decided to get there."""

    job: Job
    resolved: dict[str, Any]  # the resolved config, as config.yaml and checkpoints hold it
    model_cfg: ModelConfig
    tokenizer: Tokenizer
    tag: str | None  # the checkpoint resumed from
    universal: bool  # resumed on another number of ranks (a universal checkpoint)
    precision: PrecisionChoice


def with_train(job: Job, resolved: dict[str, Any], **changes: Any) -> tuple[Job, dict[str, Any]]:
    """A copy of the job and of its resolved config with `train.<key>` values changed."""
    return with_section(job, resolved, "train", **changes)


def with_section(
    job: Job, resolved: dict[str, Any], section: str, **changes: Any
) -> tuple[Job, dict[str, Any]]:
    """A copy of the job and of its resolved config with `<section>.<key>` values changed."""
    new_resolved = copy.deepcopy(resolved)
    new_resolved[section].update(changes)
    part = dataclasses.replace(getattr(job, section), **changes)  # type: ignore[type-var]
    return dataclasses.replace(job, **{section: part}), new_resolved  # type: ignore[type-var]


def agree_on_decisions(
    job: Job, env: DistEnv, model_cfg: ModelConfig, run: RunDir | None, saved: str | None
) -> autos.Record:
    """Every `auto` (trainer/autos.py), decided on rank 0 and handed to every rank so that all
    train alike; rank 0 states each in one line and records them in RUN/decisions.json (`run`
    None: a bench's or calibration's engine, which has no run dir)."""
    answer: list[Any] = [None, None]
    if env.is_main:
        try:
            record = autos.resolve_all(
                vars(job.train), env.device.type, model_cfg.d_model, model_cfg.d_ff,
                autos.read_record(run.decisions) if run else None, saved,
                workers=str(job.data.num_workers),
            )  # fmt: skip
            answer = [record, None]
            for line in autos.lines(record):
                print(line, flush=True)
            if job.train.precision == "bf16":
                warning = slow_bf16_warning(env.device.type, model_cfg.d_model, model_cfg.d_ff)
                if warning:
                    stderr_warn(warning)
            if run is not None:
                autos.write_record(run.decisions, record, machine_key())
        except autos.DecisionError as exc:
            answer = [None, str(exc)]
    dist.broadcast_object_list(answer, src=0)
    if answer[1] is not None:
        raise PrecisionError(answer[1])
    return answer[0]


def agree_on_precision(job: Job, env: DistEnv, model_cfg: ModelConfig) -> PrecisionChoice:
    """`train.precision` as a new run on this machine settles it, for an engine without a run
    dir (benches, `paperscale calibrate`)."""
    decision = agree_on_decisions(job, env, model_cfg, None, None).decisions["precision"]
    return PrecisionChoice(decision.value, decision.reason)


def world_size_accumulation(run: RunDir, tag: str, env: DistEnv) -> int:
    """Resuming on another number of ranks: the accumulation that keeps the saved run's global
    batch; rank 0 converts the checkpoint to DeepSpeed's universal format."""
    ckpts = run.checkpoints
    old_world = ckpts.saved_world_size(tag)
    old_accum = int(saved_setting(ckpts, tag, "train", "grad_accum"))
    accum = accumulation_for(old_accum, old_world, env.world_size)
    if env.is_main:
        print(
            f"checkpoint {tag} was saved on {old_world} ranks; continuing on "
            f"{env.world_size} with grad_accum {accum} (was {old_accum}) to keep the global "
            "batch",
            flush=True,
        )
        ensure_universal(ckpts, tag)
    dist.barrier()
    return accum


def settle_job(job: Job, run: RunDir, resolved: dict[str, Any], env: DistEnv) -> SettledJob:
    """The precision and accumulation this run trains with; rank 0 writes them into the run
    dir's config.yaml, which thereby names what the run trains in."""
    tokenizer = Tokenizer(tokenizer_path(Path(job.data.dir)))
    model_cfg = resolve_model_config(job.model, tokenizer)
    ckpts = run.checkpoints
    tag = ckpts.latest_tag()
    saved = None if tag is None else saved_setting(ckpts, tag, "train", "precision")
    record = agree_on_decisions(job, env, model_cfg, run, saved)
    job, resolved = with_train(job, resolved, **autos.values(record))
    job, resolved = with_section(job, resolved, "data", **autos.data_values(record))
    precision = record.decisions["precision"]
    choice = PrecisionChoice(precision.value, precision.reason)
    universal = tag is not None and ckpts.saved_world_size(tag) != env.world_size
    if universal:
        assert tag is not None
        job, resolved = with_train(job, resolved, grad_accum=world_size_accumulation(run, tag, env))
    if env.is_main:
        from omegaconf import OmegaConf

        from trainer.run_dir import write_atomic

        write_atomic(run.config, OmegaConf.to_yaml(OmegaConf.create(resolved)))
    return SettledJob(job, resolved, model_cfg, tokenizer, tag, universal, choice)


def cluster_peak_flops(
    env: DistEnv, precision: str, model_cfg: ModelConfig, rows: int
) -> float | None:
    """Peak FLOP/s of all ranks together, for MFU: each rank measures (CPU) or looks up (GPU)
    its own at the same time as the others, since ranks of one machine share its cores."""
    dist.barrier()
    own = peak_flops(env.device, PRECISION_DTYPES[precision], model_cfg, rows)
    total = torch.tensor([own or 0.0, 0.0 if own else 1.0], dtype=torch.float64)
    total = total.to(env.device)
    dist.all_reduce(total)
    return float(total[0]) if float(total[1]) == 0 else None
