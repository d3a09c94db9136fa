"""Tokens/s of the paperscale training step against a bare PyTorch loop, side by side.

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu .venv/bin/python -m bench.train_overhead \\
        --work /tmp/bench-overhead [--data DATA_DIR] [--config configs/tiny.yaml] \\
        [--windows 5] [--steps 10] [--smoke] [--json PATH] [key=value ...]

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
bf16 and plain fp32 otherwise.

Without --data, a synthetic corpus is written and prepared under --work first (the same
commands as tests/integration/conftest.py). `--smoke`: 2,000 synthetic pairs, d_model 32, one
window of 2 steps, a log line every step (seconds); `--json PATH` writes the two tokens/s and
the ratios as rows for bench/suite.py.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import (
    SMOKE_MODEL,
    add_output_arguments,
    prepare_synthetic,
    row,
    settle_precision,
    write_rows,
)
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


def parse_args() -> tuple[argparse.Namespace, int]:
    """The command line, and the training pairs of the synthetic corpus it asks for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--data", help="a prepared data dir (default: synthetic under --work)")
    parser.add_argument("--work", default="/tmp/bench-overhead")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per window")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per side first")
    parser.add_argument("--profile", action="store_true", help="cProfile the paperscale side")
    parser.add_argument("overrides", nargs="*")
    add_output_arguments(parser, "2,000 pairs, d_model 32, 1 window of 2 steps, log every step")
    args = parser.parse_args()
    pairs = 20000
    if args.smoke:
        pairs, args.windows, args.steps, args.warmup = 2000, 1, 2, 1
        args.overrides = [*SMOKE_MODEL, "train.log_every=1", *args.overrides]
    return args, pairs


def time_windows(
    args: argparse.Namespace, ours: PaperscaleSide, bare: BareSide,
    profiler: cProfile.Profile | None,
) -> list[tuple[int, int, float, float]]:  # fmt: skip
    """--windows windows of --steps steps, paperscale's and then the bare loop's on the same
    micro-batches (the profiler, if any, on paperscale's); (window, tokens, paperscale seconds,
    bare seconds) of each, printed as they end."""
    rows = []
    for window in range(args.windows):
        if profiler:
            profiler.enable()
        start = time.perf_counter()
        micros = [ours.step() for _ in range(args.steps)]
        ours_s = time.perf_counter() - start
        if profiler:
            profiler.disable()
        start = time.perf_counter()
        for micro in micros:
            bare.step(micro)
        bare_s = time.perf_counter() - start
        tokens = tokens_of(micros)
        rows.append((window, tokens, ours_s, bare_s))
        print(
            f"window {window}: {tokens} tokens  paperscale {tokens / ours_s:8.0f} tok/s  "
            f"bare {tokens / bare_s:8.0f} tok/s  ratio {bare_s / ours_s:.3f}",
            flush=True,
        )
    return rows


def report(
    args: argparse.Namespace, job: Any, bare: BareSide, rows: list[tuple[int, int, float, float]]
) -> None:
    """Print both sides' tokens/s over all windows and their ratios; write the rows."""
    total = sum(r[1] for r in rows)
    ours_total, bare_total = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(
        f"config {args.config} ({sum(p.numel() for p in bare.model.parameters()):,} parameters, "
        f"ZeRO {job.train.zero_stage}, {job.train.precision}, grad_accum {job.train.grad_accum}, "
        f"log_every {job.train.log_every})"
    )
    print(f"paperscale  {total / ours_total:10.0f} tokens/s")
    print(f"bare torch  {total / bare_total:10.0f} tokens/s")
    print(f"ratio       {bare_total / ours_total:10.3f}  (paperscale / bare; goal >= 0.90)")
    ratios = sorted(r[3] / r[2] for r in rows)
    print(f"median      {ratios[len(ratios) // 2]:10.3f}  (of the per-window ratios)")
    case = {
        "config": args.config,
        "precision": job.train.precision,
        "zero_stage": job.train.zero_stage,
        "grad_accum": job.train.grad_accum,
        "windows": args.windows,
        "steps": args.steps,
    }
    write_rows(
        args.json,
        [
            row("paperscale step", total / ours_total, "tokens/s", **case),
            row("bare PyTorch loop", total / bare_total, "tokens/s", **case),
            row("ratio paperscale / bare", bare_total / ours_total, "x", goal=">= 0.90", **case),
            row("median per-window ratio", ratios[len(ratios) // 2], "x", **case),
        ],
    )


def main() -> None:
    """Build both sides, warm them up, time the windows and report."""
    args, pairs = parse_args()
    work = Path(args.work)
    data_dir = Path(args.data) if args.data else prepare_synthetic(work, pairs)
    job = load_config(args.config, [f"data.dir={data_dir}", *args.overrides])
    env = init_distributed("cpu")
    model_cfg = resolve_model_config(job.model, Tokenizer(tokenizer_path(data_dir)))
    job = settle_precision(job, env, model_cfg)
    ours = PaperscaleSide(job, model_cfg, env, data_dir, work / "run")
    bare = BareSide(model_cfg, model_cfg.label_smoothing, job.train.precision)
    for _ in range(args.warmup):
        bare.step(ours.step())

    profiler = cProfile.Profile() if args.profile else None
    rows = time_windows(args, ours, bare, profiler)
    report(args, job, bare, rows)
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
        print(out.getvalue())


if __name__ == "__main__":
    main()
