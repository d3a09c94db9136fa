"""The training job: engine construction, the train step, evaluation, checkpoints, metrics."""

from __future__ import annotations

import math
import random
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from data_pipeline.config import DataConfig
from data_pipeline.loader import Batch, TokenBatchStream
from data_pipeline.tokenizer import Tokenizer
from model.config import ModelConfig
from model.loss import label_smoothed_loss
from model.transformer import Transformer
from trainer import checkpoint
from trainer.config import LoggingConfig, OptimConfig, TrainConfig
from trainer.dist import DistEnv, init_distributed
from trainer.ds_config import build_ds_config
from trainer.evaluate import validation_bleu, validation_loss
from trainer.export import export_checkpoint
from trainer.faults import Faults
from trainer.flops import peak_flops, step_flops
from trainer.metrics import (
    ConsoleSink,
    JsonlSink,
    MetricsLogger,
    Sink,
    TensorBoardSink,
    Throughput,
    WandbSink,
    memory_metrics,
    open_sink,
    stderr_warn,
)
from trainer.precision import PrecisionChoice, resolve_precision, slow_bf16_warning
from trainer.report import write_report
from trainer.safe_load import forbid_code_in_checkpoints
from trainer.schedule import build_scheduler
from trainer.signals import EXIT_NONFINITE, EXIT_SAVE_FAILED, StopRequest, Watchdog


class Job(Protocol):
    """What the trainer needs of a job's configuration (launch.config.JobConfig has it)."""

    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    logging: LoggingConfig


@dataclass
class Progress:
    step: int = 0
    tokens_seen: int = 0  # source + target tokens, all ranks
    wandb_id: str = ""


class PrecisionError(ValueError):
    """The checkpoint's precision cannot run on this machine (e.g. fp16 without a GPU)."""


COMPILE_TIMEOUT_S = 3600.0  # the watchdog's least timeout for a compiled model (see train())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_engine(
    job: Job, model_cfg: ModelConfig, env: DistEnv, load_universal: bool = False
) -> Any:
    """The model inside a DeepSpeed engine with Adam and the inverse-sqrt client scheduler."""
    import deepspeed

    model = Transformer(model_cfg)
    model.set_activation_checkpointing(job.train.activation_checkpointing)
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=1.0,
        betas=(job.optim.beta1, job.optim.beta2),
        eps=job.optim.eps,
        weight_decay=job.optim.weight_decay,
    )
    scheduler = build_scheduler(
        optimizer,
        d_model=model_cfg.d_model,
        warmup_steps=job.optim.warmup_steps,
        lr=job.optim.lr,
        warmup_init_lr=job.optim.warmup_init_lr,
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=build_ds_config(job.train, job.optim, env.world_size, load_universal),
    )
    if job.train.compile:
        # nn.Module.compile in place: parameter names, and so checkpoints, stay the same.
        # Shapes vary from batch to batch; torch.compile marks them dynamic after the first
        # recompilation instead of compiling one graph per shape.
        engine.compile(compile_kwargs={"mode": job.train.compile_mode})
    return engine


def resolve_model_config(model_cfg: ModelConfig, tokenizer: Tokenizer) -> ModelConfig:
    """Fill vocab_size from the tokenizer, or insist that both agree."""
    if model_cfg.vocab_size is None:
        return ModelConfig(**{**model_cfg.__dict__, "vocab_size": tokenizer.vocab_size})
    if model_cfg.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"model.vocab_size={model_cfg.vocab_size} but the data's tokenizer has "
            f"{tokenizer.vocab_size} pieces"
        )
    return model_cfg


def open_sinks(
    job: Job, run_dir: Path, progress: Progress, resumed_at: int | None, resolved: dict
) -> list[Sink]:
    """Rank 0's sinks: console and metrics.jsonl always; TensorBoard and wandb as configured.

    An optional sink that cannot be opened is reported in one line and left out.
    """
    sinks: list[Sink] = [
        ConsoleSink(total_steps=job.train.max_steps, start_step=progress.step),
        JsonlSink(run_dir / "metrics.jsonl", resumed_at),
    ]
    optional: list[tuple[str, Any]] = []
    if job.logging.tensorboard:
        optional.append(("tensorboard", lambda: TensorBoardSink(run_dir / "tb", resumed_at)))
    if job.logging.wandb != "disabled":
        optional.append(
            (
                "wandb",
                lambda: WandbSink(
                    run_dir,
                    job.logging.wandb,
                    job.logging.wandb_project,
                    run_dir.name,
                    progress.wandb_id,
                    resolved,
                ),
            )
        )
    for name, factory in optional:
        sink = open_sink(name, factory)
        if sink is not None:
            sinks.append(sink)
    return sinks


PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def batch_flops(model_cfg: ModelConfig, batches: list[Batch]) -> float:
    """Training FLOPs of this rank's micro-batches, from host-side shapes (no device sync)."""
    return sum(
        step_flops(
            model_cfg,
            b.n_src_tokens,
            b.n_tgt_tokens,
            int(b.src.shape[1]),
            int(b.tgt_out.shape[1]),
        )
        for b in batches
    )


def optimizer_metrics(engine: Any, precision: str) -> dict[str, float]:
    """Gradient norm of the step just taken and, under fp16, the dynamic loss scale.

    DeepSpeed returns None for the norm where its optimizer does not compute one; then the
    key is left out (it is for the whole run, since that depends on the stage only).
    """
    out: dict[str, float] = {}
    norm = engine.get_global_grad_norm()
    if norm is not None:
        out["grad_norm"] = float(norm)
    if precision == "fp16":
        opt = engine.optimizer
        scale = getattr(opt, "cur_scale", None) or getattr(opt, "loss_scale", None)
        if scale is not None:
            out["loss_scale"] = float(scale)
        # optimizer steps skipped because of fp16 overflow, since the start of this process
        out["overflow_skipped_steps"] = float(getattr(engine, "skipped_steps", 0))
    return out


def skipped_counts(stream: TokenBatchStream) -> list[float]:
    """This rank's cumulative (too long, corrupt) skipped-sample counters."""
    stats = stream.stats()
    return [float(stats["samples_skipped_long"]), float(stats["samples_skipped_corrupt"])]


def train_step(
    engine: Any, batches: list[Batch], env: DistEnv, epsilon: float, flags: list[bool]
) -> tuple[torch.Tensor, list[bool]]:
    """One optimizer step over `batches` (the accumulation micro-batches of this rank).

    The gradient is that of (sum of token losses over all ranks and micro-batches) / (target
    tokens of the whole step), as in fairseq; DeepSpeed averages over ranks and divides by the
    accumulation count, which the factor `world * accum / tokens` undoes. The one all-reduce
    that counts the step's tokens also carries this rank's `flags` (a stop request, a save due
    by the clock), so every rank acts on them at the same step.
    Returns this rank's summed (loss, nll, target tokens, source tokens), on device, and
    each flag OR-ed over the ranks.
    """
    counts = torch.tensor(
        [sum(b.n_tgt_tokens for b in batches), *map(float, flags)],
        dtype=torch.float64,
        device=env.device,
    )
    dist.all_reduce(counts)
    global_tokens, *reduced = counts.tolist()
    factor = env.world_size * len(batches) / max(global_tokens, 1.0)
    sums = torch.zeros(4, dtype=torch.float64, device=env.device)
    for batch in batches:
        batch = batch.to(env.device, non_blocking=True)
        logits = engine(batch.src, batch.tgt_in)  # (B, T, V)
        loss, nll, ntok = label_smoothed_loss(logits, batch.tgt_out, epsilon)
        engine.backward(loss * factor)
        engine.step()
        sums += torch.stack(
            [
                loss.detach().double(),
                nll.detach().double(),
                ntok.detach().double(),
                torch.tensor(float(batch.n_src_tokens), dtype=torch.float64, device=env.device),
            ]
        )
    return sums, [flag > 0 for flag in reduced]


def loss_finite_everywhere(sums: torch.Tensor, env: DistEnv) -> bool:
    """Whether the step's loss (`sums[0]`, this rank's) is finite on every rank."""
    bad = (~torch.isfinite(sums[:1])).double()
    dist.all_reduce(bad)
    return bool(bad.item() == 0)


def adapt_to_world_size(job: Job, ckpt_dir: Path, tag: str, env: DistEnv) -> None:
    """Resuming on another number of ranks: keep the saved run's global batch by changing the
    accumulation, and convert the checkpoint to DeepSpeed's universal format (rank 0)."""
    old_world = checkpoint.saved_world_size(ckpt_dir, tag)
    old_accum = int(checkpoint.saved_meta(ckpt_dir, tag)["config"]["train"]["grad_accum"])
    accum = checkpoint.accumulation_for(old_accum, old_world, env.world_size)
    if env.is_main:
        print(
            f"checkpoint {tag} was saved on {old_world} ranks; continuing on "
            f"{env.world_size} with grad_accum {accum} (was {old_accum}) to keep the global "
            "batch",
            flush=True,
        )
        checkpoint.ensure_universal(ckpt_dir, tag)
    dist.barrier()
    job.train.grad_accum = accum


def agree_on_precision(
    job: Job, env: DistEnv, model_cfg: ModelConfig, saved: str | None
) -> PrecisionChoice:
    """Resolve `train.precision` on rank 0 (its probe measures alone) and hand the answer to
    every rank, so that all train in the same precision; rank 0 states it in one line."""
    requested = job.train.precision
    answer: list[Any] = [None, None]
    if env.is_main:
        try:
            choice = resolve_precision(
                requested, env.device.type, model_cfg.d_model, model_cfg.d_ff, saved
            )
            answer = [choice, None]
            if requested == "auto":
                print(choice.line(), flush=True)
            elif requested == "bf16":
                warning = slow_bf16_warning(env.device.type, model_cfg.d_model, model_cfg.d_ff)
                if warning:
                    stderr_warn(warning)
        except ValueError as exc:
            answer = [None, str(exc)]
    dist.broadcast_object_list(answer, src=0)
    if answer[1] is not None:
        raise PrecisionError(answer[1])
    return answer[0]


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


def train(job: Job, run_dir: Path, resolved: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume) the job in this process; every rank calls this."""
    env = init_distributed(job.train.device, job.train.dist_timeout_s)
    forbid_code_in_checkpoints()
    data_dir = Path(job.data.dir)
    tokenizer = Tokenizer(data_dir / "spm.model")
    model_cfg = resolve_model_config(job.model, tokenizer)
    ckpt_dir = run_dir / "checkpoints"
    tag = checkpoint.latest_tag(ckpt_dir)
    saved_precision = None
    if tag is not None:
        saved_precision = checkpoint.saved_meta(ckpt_dir, tag)["config"]["train"]["precision"]
    choice = agree_on_precision(job, env, model_cfg, saved_precision)
    job.train.precision = choice.precision
    resolved["train"]["precision"] = choice.precision
    if env.is_main:  # the run dir's config names the precision the run trains in
        checkpoint.write_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(resolved))
    universal = tag is not None and checkpoint.saved_world_size(ckpt_dir, tag) != env.world_size
    if universal:
        adapt_to_world_size(job, ckpt_dir, tag, env)
        resolved["train"]["grad_accum"] = job.train.grad_accum
    seed_everything(job.train.seed)  # identical initial weights on every rank
    engine = build_engine(job, model_cfg, env, load_universal=universal)
    seed_everything(job.train.seed * 1000 + env.rank)  # per-rank dropout streams
    faults = Faults.from_env(env.rank)
    faults.install(engine.module)

    stream = TokenBatchStream(
        data_dir, "train", job.data, rank=env.rank, world_size=env.world_size, shuffle=True
    )
    progress = Progress(wandb_id=uuid.uuid4().hex[:12])
    resumed_at: int | None = None
    if tag is not None:
        client, rank_states = checkpoint.load(engine, ckpt_dir, tag, env.rank)
        progress = Progress(
            step=int(client["step"]),
            tokens_seen=int(client["tokens_seen"]),
            wandb_id=str(client["wandb_id"]),
        )
        stream.load_state_dicts([state["data"] for state in rank_states])
        resumed_at = progress.step
    wandb_id = [progress.wandb_id]
    dist.broadcast_object_list(wandb_id, src=0)
    progress.wandb_id = wandb_id[0]

    logger = MetricsLogger(
        open_sinks(job, run_dir, progress, resumed_at, resolved) if env.is_main else []
    )
    peak = cluster_peak_flops(env, job.train.precision, model_cfg, job.data.max_tokens)
    if env.is_main and resumed_at is not None:
        print(f"resumed from {ckpt_dir / tag} at step {resumed_at}", flush=True)

    n_params = sum(p.numel() for p in engine.module.parameters())

    def save() -> None:
        checkpoint.save(
            engine,
            ckpt_dir,
            progress.step,
            client_state={
                "step": progress.step,
                "tokens_seen": progress.tokens_seen,
                "wandb_id": progress.wandb_id,
                # lets ds_to_universal convert this checkpoint for another number of ranks
                "universal_checkpoint_info": {"universal_checkpoint_version": 0.2},
            },
            rank_state={"data": stream.state_dict(), "rng": checkpoint.rng_state()},
            rank=env.rank,
            keep_last=job.train.keep_last,
            meta={"model": model_cfg.__dict__, "config": resolved},
            n_params=n_params,
            precision=job.train.precision,
            faults=faults,
        )

    def evaluate(with_bleu: bool) -> dict[str, float]:
        """Validation metrics; the RNG streams are put back afterwards, so that a run's
        training does not depend on when it evaluated (a resumed run evaluates at its end)."""
        rng = checkpoint.rng_state()
        try:
            return _evaluate(with_bleu)
        finally:
            checkpoint.set_rng_state(rng)

    def _evaluate(with_bleu: bool) -> dict[str, float]:
        out = validation_loss(
            engine,
            data_dir,
            job.data,
            env,
            model_cfg.label_smoothing,
            job.train.eval_max_batches,
        )
        if with_bleu:
            out.update(
                validation_bleu(
                    engine,
                    data_dir,
                    job.data,
                    tokenizer,
                    env,
                    job.train.bleu_samples,
                    job.train.bleu_beam,
                )
            )
        return out

    cfg = job.train
    batches = iter(stream)
    timer = Throughput()
    window = torch.zeros(4, dtype=torch.float64, device=env.device)
    window_flops = 0.0  # this rank's training FLOPs since the last log step (host-side)
    first_loss: float | None = None
    last: dict[str, float] = {}
    started = time.perf_counter()
    start_step = progress.step
    if tag is not None and len(rank_states) == env.world_size:
        # Last thing before the first step, so that nothing done while setting up (sinks, the
        # FLOPs probe, loader workers) shifts the restored dropout stream.
        checkpoint.set_rng_state(rank_states[env.rank]["rng"])
    stop_request = StopRequest().install()
    # A compiled model compiles again on new shapes and in eval mode (minutes for the big model
    # with max-autotune): its phases get an hour at least; collectives keep dist_timeout_s.
    watchdog = Watchdog(
        max(cfg.dist_timeout_s, COMPILE_TIMEOUT_S) if cfg.compile else cfg.dist_timeout_s
    )
    last_save = time.monotonic()
    stopping = False
    failure: tuple[int, str] | None = None  # (exit code, one-line reason) of a failed run
    nonfinite_streak = 0  # consecutive steps whose loss was not finite on some rank
    step_sums: torch.Tensor | None = None
    while progress.step < cfg.max_steps and not stopping and failure is None:
        watchdog.arm()
        faults.step = progress.step + 1
        micro = [next(batches) for _ in range(cfg.grad_accum)]
        # the previous step's loss, checked here where the step's first collective syncs anyway
        prev_nonfinite = step_sums is not None and not bool(torch.isfinite(step_sums[0]))
        clock_due = bool(
            env.is_main
            and cfg.save_every_minutes
            and time.monotonic() - last_save >= 60 * cfg.save_every_minutes
        )
        sums, (stopping, save_due, prev_nonfinite) = train_step(
            engine,
            micro,
            env,
            model_cfg.label_smoothing,
            [stop_request.requested, clock_due, prev_nonfinite],
        )
        step_sums = sums
        window += sums
        window_flops += batch_flops(model_cfg, micro)
        progress.step += 1
        step = progress.step
        faults.after_step(step)
        nonfinite_streak = nonfinite_streak + 1 if prev_nonfinite else 0
        if nonfinite_streak >= cfg.max_nonfinite:
            failure = (
                EXIT_NONFINITE,
                f"the loss was not finite in {nonfinite_streak} consecutive steps "
                f"({step - nonfinite_streak}-{step - 1}; train.max_nonfinite="
                f"{cfg.max_nonfinite}); stopped without saving, the last checkpoint is "
                f"{checkpoint.latest_tag(ckpt_dir) or 'none'}",
            )
        record: dict[str, float] = {}
        final = step == cfg.max_steps
        if step % cfg.log_every == 0 or final or stopping or step == start_step + 1:
            # One collective and one host sync per log step: the device sums of the window,
            # this rank's FLOPs and its skipped-sample counters, summed over ranks.
            extra = torch.tensor(
                [window_flops, *skipped_counts(stream)], dtype=torch.float64, device=env.device
            )
            reduced = torch.cat([window, extra])
            dist.all_reduce(reduced)
            loss_sum, nll_sum, tgt, src, flops, skip_long, skip_corrupt = reduced.tolist()
            window.zero_()
            window_flops = 0.0
            progress.tokens_seen += int(src + tgt)
            seconds = timer.lap()
            record.update(
                {
                    "loss": loss_sum / tgt,
                    "ppl": math.exp(min(nll_sum / tgt, 50.0)),
                    "lr": engine.get_lr()[0],
                    **optimizer_metrics(engine, cfg.precision),
                    "src_tokens_per_s": src / seconds,
                    "tgt_tokens_per_s": tgt / seconds,
                    "tokens_per_s": (src + tgt) / seconds,
                }
            )
            if peak:
                record["mfu"] = flops / seconds / peak
            record.update(memory_metrics(env.device))
            record["samples_skipped_long"] = int(skip_long)
            record["samples_skipped_corrupt"] = int(skip_corrupt)
            if first_loss is None:
                first_loss = record["loss"]
        eval_due = (cfg.eval_every and step % cfg.eval_every == 0) or final
        if not stopping and failure is None and eval_due:
            bleu_due = (cfg.bleu_every and step % cfg.bleu_every == 0) or final
            watchdog.arm()
            with timer.paused():
                record.update(evaluate(with_bleu=bool(bleu_due)))
        if record:
            last.update(record)
            logger.log(step, record)
        save_now = bool(
            (cfg.save_every and step % cfg.save_every == 0) or final or stopping or save_due
        )
        if failure is None and save_now:
            last_save = time.monotonic()
            watchdog.arm()
            with timer.paused():
                if not loss_finite_everywhere(sums, env):
                    if env.is_main:
                        stderr_warn(f"step {step}: the loss is not finite; no checkpoint saved")
                else:
                    try:
                        save()
                    except checkpoint.CheckpointError as exc:
                        failure = (EXIT_SAVE_FAILED, str(exc))

    watchdog.disarm()
    stop_request.uninstall()
    summary: dict[str, Any] = {
        "preempted": stopping,
        "precision": choice.precision,
        "precision_reason": choice.reason,
    }
    if failure is not None:
        summary |= {"exit_code": failure[0], "error": failure[1]}
        if env.is_main:
            print(f"paperscale: error: {failure[1]}", file=sys.stderr, flush=True)
    if stopping and env.is_main:
        print(f"stopped at step {progress.step} after a signal; checkpoint saved", flush=True)
    if env.is_main:
        elapsed = time.perf_counter() - started
        summary |= {
            "steps": progress.step,
            "steps_this_run": progress.step - start_step,
            "first_loss": first_loss,
            "valid_loss": last.get("valid_loss"),
            "bleu": last.get("bleu"),
            "tokens_per_s": last.get("tokens_per_s"),
            "elapsed_s": round(elapsed, 1),
            "run_dir": str(run_dir),
        }
    final_tag = checkpoint.latest_tag(ckpt_dir)
    if env.is_main and final_tag is not None and not stopping and failure is None:
        export_checkpoint(ckpt_dir / final_tag, run_dir / "model", data_dir / "spm.model")
    dist.barrier()
    logger.close()
    if env.is_main:
        try:
            write_report(run_dir)
        except Exception as exc:  # the report is a convenience; the run itself succeeded
            stderr_warn(f"warning: report.png could not be written: {exc}")
    return summary
