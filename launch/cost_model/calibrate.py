"""`paperscale calibrate`: this machine's speed for `paperscale plan --calibration FILE`: one
rank's effective FLOP/s and its overheads per optimizer step and per micro-batch.

One process is one rank (run it with the threads a rank gets: OMP_NUM_THREADS=1 for the CPU
ranks `paperscale train` starts, each on a core), in a world of one. It steps the trainer's own
engine and step on the config's model: trainer.ds.engine.build_engine (DeepSpeed, the config's
ZeRO stage, fused Adam, the attention kernel `train.attention` resolves to) and
trainer.step.train_step, in the precision `train.precision: auto` settles on here, as a run
would. Batches are random tokens, `seq_len` long on both sides, no padding, so a micro-batch of
`tokens` computes exactly that many per side. The gradient reduction between ranks is not in a
world of one. A step's time is wall time, or on a one-thread CPU rank this process's CPU time
(`clock`), which other processes on a shared machine do not inflate.

Each micro-batch size (default the config's data.max_tokens / 2, x 1 and x 2; one micro-batch
per step), and the first again as two micro-batches per step, is timed as the median of
`steps` steps after a warm-up step. They fix the step model the plan uses
(launch/cost_model/speed.py),

    step_s = overhead_s + accum x (overhead_micro_s + tokens per micro-batch / slope)

whose overheads are what does not grow with the tokens: per optimizer step (the optimizer, the
Python around it) and per micro-batch (kernel launches, the loss's (V, d) projection gradient,
which every micro-batch computes whatever its size). With trainer/flops.py's FLOPs per token
the slope is the rank's effective FLOP/s. Then the config's own batch (data.max_tokens x
train.grad_accum) is timed and set against what the model predicts for it: the check that the
step model holds here. On a CPU the matmul peak of its threads is measured too (the model's
largest matmuls, as trainer/flops.py picks them, on the same clock), so the file also says the
MFU.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data_pipeline.batching import Batch
from launch.config import load_config
from launch.cost_model.speed import CALIBRATION_FORMAT, cpu_model
from model.config import ModelConfig
from trainer.dist import init_distributed
from trainer.ds.engine import build_engine, seed_everything
from trainer.flops import gpu_spec, largest_matmuls, step_flops
from trainer.kernels import resolve_attention
from trainer.settle import agree_on_precision
from trainer.step import train_step

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Rank:
    """One rank of the trainer: its DeepSpeed engine (trainer/ds/engine.py) and its optimizer
    step (trainer/step.py), in a world of one, stepping on random batches."""

    def __init__(self, job: Any, cfg: ModelConfig, device: str, clock: str) -> None:
        self.clock = time.process_time if clock == "cpu" else time.perf_counter
        self.env = init_distributed(device)
        choice = agree_on_precision(job, self.env, cfg)  # auto as a run settles it
        train = dataclasses.replace(job.train, precision=choice.precision)
        self.job = dataclasses.replace(job, train=train)
        self.cfg = cfg
        seed_everything(1)
        if self.env.device.type == "cpu":  # a CPU run's ranks are forked with the ops loaded
            from trainer.ds.ops import build_ops

            build_ops()
        start = time.perf_counter()
        self.engine = build_engine(self.job, cfg, self.env)
        self.build_s = time.perf_counter() - start  # in a run, on its clock (trainer/budget.py)
        self.gen = torch.Generator().manual_seed(0)
        self.walls: list[float] = []  # wall seconds of every step, in order

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
        start, wall = self.clock(), time.perf_counter()
        train_step(self.engine, micro, self.env, self.cfg.label_smoothing, [False])
        self._sync()
        self.walls.append(time.perf_counter() - wall)
        return self.clock() - start

    def _sync(self) -> None:
        """Wait for the GPU's queued work, so the clock covers it (nothing on a CPU)."""
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)

    def timed(self, tokens: int, accum: int, seq_len: int, steps: int) -> float:
        """Median seconds per step after one warm-up step."""
        self.step(tokens, accum, seq_len)
        return statistics.median(self.step(tokens, accum, seq_len) for _ in range(steps))

    def points(
        self, sizes: Sequence[int], seq_len: int, steps: int, log: Callable[[str], None]
    ) -> list[tuple[int, int, float]]:
        """(tokens, accum, seconds) of one micro-batch of each size, and of two of the first."""
        out = []
        for n, accum in [(t, 1) for t in sizes] + [(sizes[0], 2)]:
            out.append((n, accum, self.timed(n, accum, seq_len, steps)))
            log(f"{n:>8,} tokens x {accum}: {out[-1][2]:.4f} s per step")
        return out


def data_vocab(data_dir: Path) -> int | None:
    """The prepared data's vocabulary (its tokenizer's pieces), which a run's model takes where
    model.vocab_size is null (trainer.ds.engine.resolve_model_config); None without data."""
    from data_pipeline.manifest import MANIFEST_NAME, read_manifest

    if not (data_dir / MANIFEST_NAME).is_file():
        return None
    return int(read_manifest(data_dir)["vocab_size"])


def time_events(rank: Rank, log: Callable[[str], None]) -> dict[str, Any] | None:
    """Wall seconds of the trainer's own validation pass over the config's prepared validation
    split (trainer/validation.py: this rank's share of it in the calibration's world, or
    train.eval_max_batches batches) and of two decodes of its sentences, as long as their
    references (a trained model's length), at train.bleu_beam: of all the sentences an
    in-training BLEU scores (train.bleu_samples; the whole split for a BLEU target) and of half
    of them, each rank its share. None, said in `log`, without a prepared data.dir."""
    from data_pipeline.manifest import MANIFEST_NAME, read_manifest, tokenizer_path
    from data_pipeline.tokenizer import Tokenizer
    from trainer.budget import probe_decodes
    from trainer.time_costs import bleu_samples
    from trainer.validation import Evaluator

    job, data_dir = rank.job, Path(rank.job.data.dir)
    if not (data_dir / MANIFEST_NAME).is_file():
        log(f"evaluation not timed: no prepared data at data.dir={data_dir}")
        return None
    if data_vocab(data_dir) != rank.cfg.vocab_size:
        log(f"evaluation not timed: model.vocab_size={rank.cfg.vocab_size}, the data's "
            f"{data_vocab(data_dir)} pieces")  # fmt: skip
        return None
    valid = int(read_manifest(data_dir)["splits"]["valid"]["samples"])
    evaluator = Evaluator(rank.engine, job, Tokenizer(tokenizer_path(data_dir)), rank.env)
    evaluator.validation()  # warm-up: the no-grad graphs, the stream's first start
    start = time.perf_counter()
    evaluator.validation()
    eval_s = time.perf_counter() - start
    sentences = min(bleu_samples(job.train), valid)
    t_small, small, t_large, large = probe_decodes(evaluator, sentences)
    log(
        f"validation pass {eval_s:.2f} s ({valid:,} pairs, train.eval_max_batches="
        f"{job.train.eval_max_batches}); decoding {large:,} sentences {t_large:.2f} s, "
        f"{small:,} {t_small:.2f} s (beam {job.train.bleu_beam})"
    )
    return {
        "valid_samples": valid,
        "world": rank.env.world_size,  # the ranks that shared the split and the sentences
        "eval_max_batches": int(job.train.eval_max_batches),
        "eval_s": eval_s,
        "bleu_beam": int(job.train.bleu_beam),
        "decode": {"small": small, "small_s": t_small, "large": large, "large_s": t_large},
    }


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


def micro_batch_sizes(tokens: Sequence[int] | None, config_micro: int, seq_len: int) -> list[int]:
    """The micro-batch sizes to fit, in whole sentences of `seq_len` tokens: `tokens`, else the
    config's own micro-batch / 2, x 1 and x 2."""
    sizes = list(tokens) if tokens else [config_micro // 2, config_micro, config_micro * 2]
    return [max(1, t // seq_len) * seq_len for t in sizes]


def model_config(job: Any) -> ModelConfig:
    """The config's model, its vocabulary the prepared data's where model.vocab_size is null
    (as a run's), else data.vocab_size."""
    vocab = job.model.vocab_size or data_vocab(Path(job.data.dir)) or job.data.vocab_size
    return ModelConfig(**{**job.model.__dict__, "vocab_size": vocab})


def measure(
    config: str,
    overrides: Sequence[str] = (),
    *,
    tokens: Sequence[int] | None = None,
    steps: int = 5,
    seq_len: int = 32,
    device: str = "auto",
    clock: str = "auto",
    ranks: int = 1,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Everything the calibration file holds; `log` gets each point as it is measured. In a
    world of `ranks` local ranks (torchrun started them: `paperscale calibrate --ranks N`)
    every rank runs this, in step, and rank 0's figures are the calibration's: steps with the
    gradients' synchronisation, each rank's share of the validation pass and decodes."""
    job = load_config(config, list(overrides))
    cfg = model_config(job)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    micro = job.data.max_tokens
    sizes = micro_batch_sizes(tokens, micro, seq_len)
    if clock == "auto":  # a one-thread CPU rank alone: its own CPU seconds (waits are not)
        alone = device == "cpu" and torch.get_num_threads() == 1 and ranks == 1
        clock = "cpu" if alone else "wall"
    rank = Rank(job, cfg, device, clock)
    if rank.env.world_size != ranks:
        raise RuntimeError(f"calibrating {ranks} ranks in a world of {rank.env.world_size}")
    if ranks > 1:
        log(f"{ranks} ranks in one world, timed on rank 0 (the gradients' synchronisation in)")
    figures = _measured(rank, job, cfg, sizes, steps, seq_len, device, clock, log)
    return figures | {"ranks": ranks, "config": str(config), "overrides": list(overrides)}


def _measured(
    rank: Rank, job: Any, cfg: ModelConfig, sizes: list[int], steps: int, seq_len: int,
    device: str, clock: str, log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    """measure's figures, timed on `rank`."""
    vocab, micro = cfg.vocab_size, job.data.max_tokens
    points = rank.points(sizes, seq_len, steps, log)
    per_step, per_micro, slope = fit_step_model(points)
    per_token = step_flops(cfg, 1000, 1000, seq_len, seq_len) / 1000
    rate = per_token / slope
    accum = job.train.grad_accum
    check_s = rank.timed(micro, accum, seq_len, steps)
    predicted = per_step + accum * (per_micro + micro * per_token / rate)
    log(
        f"{micro:>8,} tokens x {accum}: {check_s:.4f} s per step, "
        f"the model says {predicted:.4f} s ({predicted / check_s - 1:+.1%})"
    )
    facts = device_facts(device, rank.precision, cfg, micro, clock)
    # the first step beyond the next of the same size: a compiled model's compile, first use
    first = rank.walls[0] - rank.walls[1]
    return {
        "format": CALIBRATION_FORMAT,
        "device": device,
        **facts,
        "precision": rank.precision,
        "attention": resolve_attention(job.train.attention, device, rank.precision).name,
        "threads": torch.get_num_threads() if device == "cpu" else 1,
        "clock": clock,
        "flops_per_s": rate,
        "overhead_s": per_step,
        "overhead_micro_s": per_micro,
        "mfu": rate / facts["peak_flops"] if facts["peak_flops"] else None,
        "seq_len": seq_len,
        "model": {"d_model": cfg.d_model, "d_ff": cfg.d_ff, "vocab_size": int(vocab)},
        "points": [{"micro_tokens": t, "grad_accum": a, "step_s": s} for t, a, s in points],
        "check": {
            "micro_tokens": micro,
            "grad_accum": accum,
            "step_s": check_s,
            "predicted_s": predicted,
            "error": predicted / check_s - 1,
        },
        # start-up before training: the engine built, its first step's extra (a compile)
        "startup": {"engine_s": rank.build_s, "first_step_extra_s": max(first, 0.0)},
        "events": time_events(rank, log),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def describe(cal: dict[str, Any]) -> str:
    """The calibration in one line: the rate, its share of the matmul peak, the overheads."""
    peak = (
        f", {cal['mfu']:.0%} of a {cal['peak_flops'] / 1e9:,.1f} GFLOP/s matmul peak"
        if cal["mfu"]
        else ""
    )
    return (
        f"{cal['device_name']} ({cal['precision']}, {cal['threads']} thread(s)): "
        f"{cal['flops_per_s'] / 1e9:,.2f} GFLOP/s effective{peak}, "
        f"overhead {cal['overhead_s'] * 1e3:.1f} ms per step + "
        f"{cal['overhead_micro_s'] * 1e3:.1f} ms per micro-batch"
    )
