"""Rank 0's metrics sinks for a run: console and metrics.jsonl always, TensorBoard and wandb as
configured (trainer/metrics.py has the sinks themselves)."""

from __future__ import annotations

from typing import Any

from trainer.ds.engine import Job
from trainer.metrics import (
    ConsoleSink,
    JsonlSink,
    Sink,
    TensorBoardSink,
    WandbSink,
    open_sink,
)
from trainer.run_dir import RunDir
from trainer.state import TrainState


def open_sinks(
    job: Job, run: RunDir, state: TrainState, resumed_at: int | None, resolved: dict[str, Any]
) -> list[Sink]:
    """The sinks of this run; an optional one that cannot be opened is reported in one line
    and left out. A resumed run appends from `resumed_at` on, to the same wandb run."""
    sinks: list[Sink] = [
        ConsoleSink(total_steps=job.train.max_steps, start_step=state.step),
        JsonlSink(run.metrics, resumed_at),
    ]
    optional: list[tuple[str, Any]] = []
    if job.logging.tensorboard:
        optional.append(("tensorboard", lambda: TensorBoardSink(run.tensorboard, resumed_at)))
    if job.logging.wandb != "disabled":
        optional.append(
            (
                "wandb",
                lambda: WandbSink(
                    run.root,
                    job.logging.wandb,
                    job.logging.wandb_project,
                    run.root.name,
                    state.wandb_id,
                    resolved,
                ),
            )
        )
    for name, factory in optional:
        sink = open_sink(name, factory)
        if sink is not None:
            sinks.append(sink)
    return sinks
