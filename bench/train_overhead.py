"""Tokens/s of the paperscale training step against a bare PyTorch loop, side by side.

One process (a world of one). The paperscale side is the trainer's own step: the DeepSpeed
engine from trainer.ds.engine.build_engine (ZeRO and accumulation as configured), batches
streamed by data_pipeline's TokenBatchStream from real shards, trainer.step.train_step, the
per-step window sums and host-side FLOPs, and every `train.log_every` steps the all-reduce and
a metrics.jsonl line through MetricsLogger. The bare side is the same Transformer in plain
PyTorch: its training forward (the same chunked label-smoothed loss sums), the same loss
normalisation, torch.optim.AdamW, replaying exactly the micro-batches the paperscale side
consumed in the window before (so the token counts are equal and the bare side pays no data
loading). Windows alternate, so the machine's load drifts equally on both; the figure is the
ratio of summed tokens/s.

Both sides compute in the same precision, so the ratio measures the trainer's overhead and not
a precision difference: `train.precision` is settled as a training run settles it (`auto`:
bf16 only where the CPU computes it natively, else fp32; PAPERSCALE_CPU_BF16=0|1 forces it),
the engine is built with it, and the bare loop runs fp32 weights under bf16 autocast when it is
bf16 and plain fp32 otherwise. Without `data`, a synthetic corpus of `pairs` training pairs is
prepared under the work directory first.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import Row, prepare_synthetic, row, settle_precision
from data_pipeline.loader import Batch, TokenBatchStream
from data_pipeline.manifest import tokenizer_path
from data_pipeline.tokenizer import Tokenizer
from launch.config import load_config
from model.transformer import Transformer
from trainer.dist import init_distributed
from trainer.ds.engine import build_engine, resolve_model_config, seed_everything
from trainer.metrics import MetricsLogger, Throughput
from trainer.run_dir import RunDir
from trainer.sinks import JsonlSink
from trainer.step import batch_flops, skipped_counts, train_step


class PaperscaleSide:
    """The trainer's step with its stream, window sums and periodic metrics logging."""

    def __init__(self, job: Any, model_cfg: Any, env: Any, data_dir: Path, run_dir: Path) -> None:
        seed_everything(job.train.seed)
        self.engine = build_engine(job, model_cfg, env)
        self.job, self.model_cfg, self.env = job, model_cfg, env
        self.stream = TokenBatchStream(
            data_dir, "train", job.data, rank=env.rank, world_size=env.world_size, shuffle=True
        )
        self.batches = iter(self.stream)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.logger = MetricsLogger([JsonlSink(RunDir(run_dir).metrics)])
        self.window = torch.zeros(4, dtype=torch.float64, device=env.device)
        self.window_flops = 0.0
        self.timer = Throughput()
        self.step_no = 0

    def step(self) -> list[Batch]:
        micro = [next(self.batches) for _ in range(self.job.train.grad_accum)]
        sums = train_step(
            self.engine, micro, self.env, self.model_cfg.label_smoothing, [False, False]
        ).sums
        self.window += sums
        self.window_flops += batch_flops(self.model_cfg, micro)
        self.step_no += 1
        if self.step_no % self.job.train.log_every == 0:
            extra = torch.tensor(
                [self.window_flops, *skipped_counts(self.stream)], dtype=torch.float64
            )
            reduced = torch.cat([self.window, extra])
            torch.distributed.all_reduce(reduced)
            loss_sum, _, tgt, src, *_ = reduced.tolist()
            self.window.zero_()
            self.window_flops = 0.0
            seconds = self.timer.lap()
            self.logger.log(
                self.step_no,
                {
                    "loss": loss_sum / tgt,
                    "lr": self.engine.get_lr()[0],
                    "tokens_per_s": (src + tgt) / seconds,
                },
            )
        return micro


class BareSide:
    """The same model in plain PyTorch: AdamW, no DeepSpeed, no loader; bf16 autocast over
    fp32 weights when the paperscale side trains in bf16, plain fp32 when it trains in fp32."""

    def __init__(self, model_cfg: Any, epsilon: float, precision: str) -> None:
        seed_everything(1)
        self.model = Transformer(model_cfg).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98))
        self.epsilon = epsilon
        self.bf16 = precision == "bf16"

    def step(self, micro: list[Batch]) -> None:
        tokens = sum(b.n_tgt_tokens for b in micro)
        for batch in micro:
            autocast = (
                torch.autocast("cpu", dtype=torch.bfloat16)
                if self.bf16
                else contextlib.nullcontext()
            )
            with autocast:
                loss, _, _ = self.model(
                    batch.src,
                    batch.tgt_in,
                    batch.tgt_out,
                    self.epsilon,
                    src_padded=batch.src_padded,
                )
            (loss / tokens).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def tokens_of(micros: list[list[Batch]]) -> int:
    return sum(b.n_src_tokens + b.n_tgt_tokens for micro in micros for b in micro)


def time_windows(
    windows: int, steps: int, ours: PaperscaleSide, bare: BareSide
) -> list[tuple[int, float, float]]:
    """`windows` windows of `steps` steps, paperscale's and then the bare loop's on the same
    micro-batches; (tokens, paperscale seconds, bare seconds) of each."""
    out = []
    for _ in range(windows):
        start = time.perf_counter()
        micros = [ours.step() for _ in range(steps)]
        ours_s = time.perf_counter() - start
        start = time.perf_counter()
        for micro in micros:
            bare.step(micro)
        out.append((tokens_of(micros), ours_s, time.perf_counter() - start))
    return out


def measure(
    work: Path,
    config: str = "configs/tiny.yaml",
    data: str = "",
    pairs: int = 20000,
    windows: int = 5,
    steps: int = 10,
    warmup: int = 3,
    overrides: Sequence[str] = (),
) -> list[Row]:
    """Build both sides, warm them up (`warmup` untimed steps each), time the windows."""
    data_dir = Path(data) if data else prepare_synthetic(work, pairs)
    job = load_config(config, [f"data.dir={data_dir}", *overrides])
    env = init_distributed("cpu")
    model_cfg = resolve_model_config(job.model, Tokenizer(tokenizer_path(data_dir)))
    job = settle_precision(job, env, model_cfg)
    ours = PaperscaleSide(job, model_cfg, env, data_dir, work / "run")
    bare = BareSide(model_cfg, model_cfg.label_smoothing, job.train.precision)
    for _ in range(warmup):
        bare.step(ours.step())
    timed = time_windows(windows, steps, ours, bare)
    total, ours_s, bare_s = (sum(t[i] for t in timed) for i in range(3))
    ratios = sorted(t[2] / t[1] for t in timed)
    case = {"config": config, "precision": job.train.precision, "zero_stage": job.train.zero_stage,
            "grad_accum": job.train.grad_accum, "windows": windows, "steps": steps}  # fmt: skip
    return [
        row("paperscale step", total / ours_s, "tokens/s", **case),
        row("bare PyTorch loop", total / bare_s, "tokens/s", **case),
        row("ratio paperscale / bare", bare_s / ours_s, "x", goal=">= 0.90", **case),
        row("median per-window ratio", ratios[len(ratios) // 2], "x", **case),
    ]
