"""Calibration of `paperscale plan`'s step time on this machine: one rank's effective FLOP/s and
its overheads per optimizer step and per micro-batch, written to the file that
`paperscale plan --calibration FILE` reads.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.plan_calibration --out plan-calibration.json \\
        [--config configs/tiny.yaml] [--tokens 768,1536,3072] [--steps 5] [--seq-len 32] \\
        [--smoke] [--json PATH] [key=value ...]

One process is one rank (run it with the threads a rank gets: OMP_NUM_THREADS=1 for the CPU
ranks `paperscale train` starts, each on a core), in a world of one. It steps the trainer's own
engine and step on the config's model: trainer.ds.engine.build_engine (DeepSpeed, the config's
ZeRO stage, fused Adam, the attention kernel `train.attention` resolves to) and
trainer.step.train_step, in the precision `train.precision: auto` settles on here, as a run
would. Batches are random tokens, `--seq-len` long on both sides, no padding, so a micro-batch of
`tokens` computes exactly that many per side. The gradient reduction between ranks is not in a
world of one. A step's time is wall time, or on a one-thread CPU rank this process's CPU time
(`--clock`), which other processes on a shared machine do not inflate.

Each point of `--tokens` (one micro-batch per step; default the config's data.max_tokens / 2,
x 1 and x 2), and the first again as two micro-batches per step, is timed as the median of
`--steps` steps after a warm-up step. They fix the step model `paperscale plan` uses,

    step_s = overhead_s + accum x (overhead_micro_s + tokens per micro-batch / slope)

whose overheads are what does not grow with the tokens: per optimizer step (the optimizer, the
Python around it) and per micro-batch (kernel launches, the loss's (V, d) projection gradient,
which every micro-batch computes whatever its size). With trainer/flops.py's FLOPs per token
the slope is the rank's effective FLOP/s. Then the config's own batch (data.max_tokens x
train.grad_accum) is timed and set against what the model predicts for it: the check that the
plan's step model holds here. On a CPU the matmul peak of its threads is measured too (the
model's largest matmuls, as trainer/flops.py picks them, on the same clock), so the file also
says the MFU.

`--smoke`: d_model 32 and one layer a side, points of 64 and 256 tokens (and 64 x 2), the check
at 256 x 2, two timed steps each (seconds); `--json PATH` writes the figures as rows for
bench/suite.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import SMOKE_MODEL, add_output_arguments, row, settle_precision, write_rows
from bench.machine import cpu_model
from data_pipeline.batching import Batch
from launch.config import load_config
from launch.cost_model.speed import CALIBRATION_FORMAT
from model.config import ModelConfig
from trainer.dist import init_distributed
from trainer.ds.engine import build_engine, seed_everything
from trainer.flops import gpu_spec, largest_matmuls, step_flops
from trainer.kernels import resolve_attention
from trainer.step import train_step

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Rank:
    """One rank of the trainer: its DeepSpeed engine (trainer/ds/engine.py) and its optimizer
    step (trainer/step.py), in a world of one, stepping on random batches."""

    def __init__(self, job: Any, cfg: ModelConfig, device: str, clock: str) -> None:
        self.clock = time.process_time if clock == "cpu" else time.perf_counter
        self.env = init_distributed(device)
        self.job = settle_precision(job, self.env, cfg)
        self.cfg = cfg
        seed_everything(1)
        self.engine = build_engine(self.job, cfg, self.env)
        self.gen = torch.Generator().manual_seed(0)

    @property
    def precision(self) -> str:
        """The precision the engine trains in (auto settled as a training run settles it)."""
        return str(self.job.train.precision)

    def batch(self, tokens: int, seq_len: int) -> Batch:
        """Random pairs of tokens // seq_len rows, seq_len long on both sides, no padding."""
        rows = max(1, tokens // seq_len)
        vocab = int(self.cfg.vocab_size or 8)
        ids = torch.randint(4, vocab, (rows, 2 * seq_len + 1), generator=self.gen)
        src, tgt_in, tgt_out = ids[:, :seq_len], ids[:, seq_len:-1], ids[:, seq_len + 1 :]
        n = rows * seq_len
        return Batch(src, tgt_in, tgt_out, n_src_tokens=n, n_tgt_tokens=n)

    def step(self, tokens: int, accum: int, seq_len: int) -> float:
        """Seconds of one optimizer step of `accum` micro-batches of `tokens` tokens per side."""
        micro = [self.batch(tokens, seq_len) for _ in range(accum)]
        self._sync()
        start = self.clock()
        train_step(self.engine, micro, self.env, self.cfg.label_smoothing, [False])
        self._sync()
        return self.clock() - start

    def _sync(self) -> None:
        """Wait for the GPU's queued work, so the clock covers it (nothing on a CPU)."""
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)

    def timed(self, tokens: int, accum: int, seq_len: int, steps: int) -> float:
        """Median seconds per step after one warm-up step."""
        self.step(tokens, accum, seq_len)
        return statistics.median(self.step(tokens, accum, seq_len) for _ in range(steps))


def fit_step_model(points: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """(overhead per step, overhead per micro-batch, seconds per token) of
    step_s = per_step + accum x per_micro + accum x tokens x per_token, fitted to
    (tokens per micro-batch, accum, seconds) points by least squares with every term >= 0.

    Steps of one micro-batch at several sizes fix the slope and the sum of the two overheads;
    a step of two micro-batches separates them. Timing noise can ask for a negative term,
    which has no meaning here: the best fit with that term at zero is taken instead (each
    subset of the terms is fitted, the best one whose terms are all >= 0 wins).
    """
    rows = np.array([[1.0, a, a * t] for t, a, _ in points])
    seconds = np.array([s for _, _, s in points])
    best: tuple[float, np.ndarray] | None = None
    for keep in itertools.product((True, False), repeat=3):
        if not keep[2]:
            continue  # the tokens' term stays: the rate is what is measured
        cols = [i for i in range(3) if keep[i]]
        coef, *_ = np.linalg.lstsq(rows[:, cols], seconds, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(3)
        full[cols] = coef
        residual = float(((rows @ full - seconds) ** 2).sum())
        if best is None or residual < best[0]:
            best = (residual, full)
    if best is None:
        raise ValueError("step time does not grow with the tokens: time larger micro-batches")
    per_step, per_micro, per_token = (float(x) for x in best[1])
    return per_step, per_micro, per_token


def cpu_matmul_peak(dtype: torch.dtype, cfg: ModelConfig, rows: int, clock: str) -> float:
    """FLOP/s of the best of the model's largest matmuls (trainer/flops.py's shapes), each the
    best of five calls, timed on the calibration's clock (trainer.flops.measured_cpu_peak_flops
    times wall seconds, which a loaded machine inflates)."""
    timer = time.process_time if clock == "cpu" else time.perf_counter
    best = 0.0
    for m, k, n in largest_matmuls(cfg, rows):
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        torch.mm(a, b)  # warm-up
        seconds = float("inf")
        for _ in range(5):
            start = timer()
            torch.mm(a, b)
            seconds = min(seconds, timer() - start)
        best = max(best, 2.0 * m * k * n / max(seconds, 1e-9))
    return best


def device_facts(
    device: str, precision: str, cfg: ModelConfig, rows: int, clock: str
) -> dict[str, Any]:
    """Name, table key, matmul peak at the precision and memory of the device measured."""
    if device == "cuda":
        name = torch.cuda.get_device_name()
        spec = gpu_spec(name)
        peak = None if spec is None else (spec.single if precision == "fp32" else spec.half)
        memory = torch.cuda.get_device_properties(0).total_memory / 2**30
        return {
            "device_name": name,
            "gpu_key": spec.key if spec else None,
            "peak_flops": peak,
            "memory_gib": memory,
        }
    peak = cpu_matmul_peak(DTYPES[precision], cfg, rows, clock)
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    return {"device_name": cpu_model(), "gpu_key": None, "peak_flops": peak, "memory_gib": pages}


def parse_args() -> argparse.Namespace:
    """The command line; `--smoke` shrinks the model, the points and the steps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--out", help="the calibration file for `paperscale plan --calibration`")
    parser.add_argument(
        "--tokens",
        help="micro-batch sizes to fit (default: the config's data.max_tokens / 2, x 1, x 2)",
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per point (5)")
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per sentence (32)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--clock",
        choices=["auto", "wall", "cpu"],
        default="auto",
        help="what a step's time is: wall seconds, or this process's CPU seconds (auto: CPU "
        "seconds for a one-thread CPU rank, which other processes on the machine do not inflate)",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    add_output_arguments(parser, "d_model 32, 1+1 layers, points of 64 and 256 tokens")
    args = parser.parse_args()
    if args.smoke:
        args.overrides = [*SMOKE_MODEL, "data.max_tokens=256", *args.overrides]
        args.tokens, args.steps, args.seq_len = args.tokens or "64,256", 2, 16
    return args


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the calibration file holds; prints each point as it is measured."""
    job = load_config(args.config, args.overrides)
    vocab = job.model.vocab_size or job.data.vocab_size
    cfg = ModelConfig(**{**job.model.__dict__, "vocab_size": vocab})
    device = (
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    micro = job.data.max_tokens
    default = [micro // 2, micro, micro * 2]  # around the config's own micro-batch
    sizes = [int(t) for t in args.tokens.split(",")] if args.tokens else default
    sizes = [max(1, t // args.seq_len) * args.seq_len for t in sizes]  # whole sentences
    one_thread = device == "cpu" and torch.get_num_threads() == 1
    clock = args.clock if args.clock != "auto" else ("cpu" if one_thread else "wall")
    rank = Rank(job, cfg, device, clock)
    precision = rank.precision
    attention = resolve_attention(job.train.attention, device, precision).name
    points = []
    for tokens, accum in [(t, 1) for t in sizes] + [(sizes[0], 2)]:
        points.append((tokens, accum, rank.timed(tokens, accum, args.seq_len, args.steps)))
        print(f"{tokens:>8,} tokens x {accum}: {points[-1][2]:.4f} s per step", flush=True)
    per_step, per_micro, slope = fit_step_model(points)
    per_token = step_flops(cfg, 1000, 1000, args.seq_len, args.seq_len) / 1000
    rate = per_token / slope
    accum = job.train.grad_accum
    check_s = rank.timed(micro, accum, args.seq_len, args.steps)
    predicted = per_step + accum * (per_micro + micro * per_token / rate)
    print(
        f"{micro:>8,} tokens x {accum}: {check_s:.4f} s per step, "
        f"the model says {predicted:.4f} s ({predicted / check_s - 1:+.1%})"
    )
    facts = device_facts(device, precision, cfg, micro, clock)
    return {
        "format": CALIBRATION_FORMAT,
        "device": device,
        **facts,
        "precision": precision,
        "attention": attention,
        "threads": torch.get_num_threads() if device == "cpu" else 1,
        "clock": clock,
        "flops_per_s": rate,
        "overhead_s": per_step,
        "overhead_micro_s": per_micro,
        "mfu": rate / facts["peak_flops"] if facts["peak_flops"] else None,
        "seq_len": args.seq_len,
        "model": {"d_model": cfg.d_model, "d_ff": cfg.d_ff, "vocab_size": int(vocab)},
        "points": [{"micro_tokens": t, "grad_accum": a, "step_s": s} for t, a, s in points],
        "check": {
            "micro_tokens": micro,
            "grad_accum": accum,
            "step_s": check_s,
            "predicted_s": predicted,
            "error": predicted / check_s - 1,
        },
        "config": str(args.config),
        "overrides": list(args.overrides),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main() -> None:
    """Measure, print the figures, write the calibration file and the suite's rows."""
    args = parse_args()
    cal = measure(args)
    peak = (
        f", {cal['mfu']:.0%} of a {cal['peak_flops'] / 1e9:,.1f} GFLOP/s matmul peak"
        if (cal["mfu"])
        else ""
    )
    print(
        f"{cal['device_name']} ({cal['precision']}, {cal['threads']} thread(s)): "
        f"{cal['flops_per_s'] / 1e9:,.2f} GFLOP/s effective{peak}, "
        f"overhead {cal['overhead_s'] * 1e3:.1f} ms per step + "
        f"{cal['overhead_micro_s'] * 1e3:.1f} ms per micro-batch"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(cal, indent=1) + "\n")
        print(f"calibration      {args.out}")
    write_rows(
        args.json,
        [
            row("effective rate per rank", cal["flops_per_s"] / 1e9, "GFLOP/s"),
            row("overhead per step", cal["overhead_s"] * 1e3, "ms"),
            row("overhead per micro-batch", cal["overhead_micro_s"] * 1e3, "ms"),
            row("step at the config's batch", cal["check"]["step_s"], "s"),
            row("model's error at the config's batch", cal["check"]["error"] * 100, "%"),
        ],
    )


if __name__ == "__main__":
    main()
