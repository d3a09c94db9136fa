"""The training job: engine construction, the train step, evaluation, checkpoints, metrics."""

from __future__ import annotations

import math
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

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
from trainer.metrics import ConsoleSink, JsonlSink, MetricsLogger, Sink, WandbSink
from trainer.schedule import build_scheduler


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_engine(job: Job, model_cfg: ModelConfig, env: DistEnv) -> Any:
    """The model inside a DeepSpeed engine with Adam and the inverse-sqrt client scheduler."""
    import deepspeed

    model = Transformer(model_cfg)
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
        config=build_ds_config(job.train, job.optim, env.world_size),
    )
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
    sinks: list[Sink] = [ConsoleSink(), JsonlSink(run_dir / "metrics.jsonl", resumed_at)]
    if job.logging.wandb != "disabled":
        try:
            sinks.append(
                WandbSink(
                    run_dir,
                    job.logging.wandb,
                    job.logging.wandb_project,
                    run_dir.name,
                    progress.wandb_id,
                    resolved,
                )
            )
        except Exception as exc:
            print(f"warning: wandb could not start and is switched off: {exc}", flush=True)
    return sinks


class StepTimer:
    """Tokens per second between two log points (wall time on rank 0)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.tokens = 0

    def rate(self) -> float:
        elapsed = time.perf_counter() - self.start
        rate = self.tokens / elapsed if elapsed > 0 else 0.0
        self.start, self.tokens = time.perf_counter(), 0
        return rate


def train_step(
    engine: Any, batches: list[Batch], env: DistEnv, epsilon: float
) -> tuple[torch.Tensor, int]:
    """One optimizer step over `batches` (the accumulation micro-batches of this rank).

    The gradient is that of (sum of token losses over all ranks and micro-batches) / (target
    tokens of the whole step), as in fairseq; DeepSpeed averages over ranks and divides by the
    accumulation count, which the factor `world * accum / tokens` undoes.
    Returns the summed (loss, nll, target tokens, source tokens) of this rank, on device,
    and the step's global target-token count.
    """
    counts = torch.tensor(
        [sum(b.n_tgt_tokens for b in batches)], dtype=torch.float64, device=env.device
    )
    dist.all_reduce(counts)
    global_tokens = int(counts.item())
    factor = env.world_size * len(batches) / max(global_tokens, 1)
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
    return sums, global_tokens


def train(job: Job, run_dir: Path, resolved: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume) the job in this process; every rank calls this."""
    env = init_distributed(job.train.device)
    data_dir = Path(job.data.dir)
    tokenizer = Tokenizer(data_dir / "spm.model")
    model_cfg = resolve_model_config(job.model, tokenizer)
    seed_everything(job.train.seed)  # identical initial weights on every rank
    engine = build_engine(job, model_cfg, env)
    seed_everything(job.train.seed * 1000 + env.rank)  # per-rank dropout streams

    ckpt_dir = run_dir / "checkpoints"
    stream = TokenBatchStream(
        data_dir, "train", job.data, rank=env.rank, world_size=env.world_size, shuffle=True
    )
    progress = Progress(wandb_id=uuid.uuid4().hex[:12])
    resumed_at: int | None = None
    tag = checkpoint.latest_tag(ckpt_dir)
    if tag is not None:
        client, mine = checkpoint.load(engine, ckpt_dir, tag, env.rank)
        progress = Progress(
            step=int(client["step"]),
            tokens_seen=int(client["tokens_seen"]),
            wandb_id=str(client["wandb_id"]),
        )
        stream.load_state_dict(mine["data"])
        checkpoint.set_rng_state(mine["rng"])
        resumed_at = progress.step
    wandb_id = [progress.wandb_id]
    dist.broadcast_object_list(wandb_id, src=0)
    progress.wandb_id = wandb_id[0]

    logger = MetricsLogger(
        open_sinks(job, run_dir, progress, resumed_at, resolved) if env.is_main else []
    )
    if env.is_main and resumed_at is not None:
        print(f"resumed from {ckpt_dir / tag} at step {resumed_at}", flush=True)

    def save() -> None:
        checkpoint.save(
            engine,
            ckpt_dir,
            progress.step,
            client_state={
                "step": progress.step,
                "tokens_seen": progress.tokens_seen,
                "wandb_id": progress.wandb_id,
            },
            rank_state={"data": stream.state_dict(), "rng": checkpoint.rng_state()},
            rank=env.rank,
            keep_last=job.train.keep_last,
            meta={"model": model_cfg.__dict__, "config": resolved},
        )

    def evaluate(with_bleu: bool) -> dict[str, float]:
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
                validation_bleu(engine, data_dir, job.data, tokenizer, env, job.train.bleu_samples)
            )
        return out

    cfg = job.train
    batches = iter(stream)
    timer = StepTimer()
    window = torch.zeros(4, dtype=torch.float64, device=env.device)
    first_loss: float | None = None
    last: dict[str, float] = {}
    started = time.perf_counter()
    start_step = progress.step
    while progress.step < cfg.max_steps:
        micro = [next(batches) for _ in range(cfg.grad_accum)]
        sums, _ = train_step(engine, micro, env, model_cfg.label_smoothing)
        window += sums
        progress.step += 1
        step = progress.step
        record: dict[str, float] = {}
        if step % cfg.log_every == 0 or step == cfg.max_steps or step == start_step + 1:
            dist.all_reduce(window)
            loss_sum, nll_sum, tgt, src = window.tolist()
            window.zero_()
            progress.tokens_seen += int(src + tgt)
            timer.tokens += int(src + tgt)
            record.update(
                {
                    "loss": loss_sum / tgt,
                    "ppl": math.exp(min(nll_sum / tgt, 50.0)),
                    "lr": engine.get_lr()[0],
                    "tokens_per_s": timer.rate(),
                }
            )
            if first_loss is None:
                first_loss = record["loss"]
        final = step == cfg.max_steps
        if (cfg.eval_every and step % cfg.eval_every == 0) or final:
            bleu_due = (cfg.bleu_every and step % cfg.bleu_every == 0) or final
            record.update(evaluate(with_bleu=bool(bleu_due)))
        if record:
            last.update(record)
            logger.log(step, record)
        if (cfg.save_every and step % cfg.save_every == 0) or final:
            save()

    summary: dict[str, Any] = {}
    if env.is_main:
        elapsed = time.perf_counter() - started
        summary = {
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
    if env.is_main and final_tag is not None:
        export_checkpoint(ckpt_dir / final_tag, run_dir / "model", data_dir / "spm.model")
    dist.barrier()
    logger.close()
    return summary
