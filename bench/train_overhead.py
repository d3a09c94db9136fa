"""Tokens/s of the paperscale training step against a bare PyTorch loop, side by side.

One process. The paperscale side is trainer.loop.Trainer as `paperscale train` builds it
(engine, loader on real shards) and the loop's body per step (step, log, evaluate and save when
due). The bare side is the same recipe in plain PyTorch (bench/recipe.py BareLoop), replaying
the micro-batches the trainer consumed in the window before (equal tokens, no data loading), in
the precision the trainer settled on (bf16 autocast or fp32). Windows alternate, so that the
machine's load drifts equally on both; the figure is the ratio of summed tokens/s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import QUIET_SINKS, Row, prepare_synthetic, row
from bench.recipe import BareLoop
from data_pipeline.loader import Batch
from launch.config import load_config, to_dict
from trainer.dist import init_distributed
from trainer.loop import Trainer
from trainer.run_dir import RunDir
from trainer.settle import settle_job
from trainer.signals import StopRequest


class Taken:
    """The trainer's batch iterator, keeping the batches it hands out since the last `clear`."""

    def __init__(self, batches: Iterator[Batch]) -> None:
        self.batches, self.taken = batches, list[Batch]()

    def __iter__(self) -> Taken:
        return self

    def __next__(self) -> Batch:
        self.taken.append(next(self.batches))
        return self.taken[-1]


def open_trainer(job: Any, run_dir: Path) -> Trainer:
    """The trainer of a new run of `job`, set up as `paperscale train` sets it up."""
    env = init_distributed("cpu")
    run = RunDir(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(settle_job(job, run, to_dict(job), env), run, env, StopRequest())
    trainer.restore_and_open()
    trainer.batches = Taken(trainer.batches)
    return trainer


def trainer_steps(trainer: Trainer, steps: int) -> list[list[Batch]]:
    """`steps` turns of the training loop's body; the micro-batches of each step."""
    taken = trainer.batches
    assert isinstance(taken, Taken)
    taken.taken.clear()
    for _ in range(steps):
        trainer.step()
        trainer.maybe_log()
        trainer.maybe_evaluate()
        trainer.maybe_save()
    k = trainer.cfg.grad_accum
    return [taken.taken[i : i + k] for i in range(0, len(taken.taken), k)]


def tokens_of(micros: list[list[Batch]]) -> int:
    return sum(b.n_src_tokens + b.n_tgt_tokens for micro in micros for b in micro)


def time_windows(
    windows: int, steps: int, trainer: Trainer, bare: BareLoop
) -> list[tuple[int, float, float]]:
    """`windows` windows of `steps` steps, the trainer's and then the bare loop's on the same
    micro-batches: (tokens, paperscale seconds, bare seconds) of each."""
    out = []
    for _ in range(windows):
        start = time.perf_counter()
        micros = trainer_steps(trainer, steps)
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
    only_steps = ["train.max_steps=1000000000", "train.budget_minutes=0", "train.eval_every=0",
                  "train.save_every=0", "train.bleu_every=0"]  # fmt: skip
    job = load_config(config, [f"data.dir={data_dir}", *QUIET_SINKS, *only_steps, *overrides])
    trainer = open_trainer(job, work / "run")
    job, model_cfg = trainer.job, trainer.model_cfg
    bare = BareLoop(model_cfg, job.optim, seed=1, bf16=job.train.precision == "bf16")
    for micro in trainer_steps(trainer, warmup):
        bare.step(micro)
    timed = time_windows(windows, steps, trainer, bare)
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
