"""Rank 0's metrics sinks: the console, metrics.jsonl, TensorBoard and wandb, and the run's set
(console and metrics.jsonl always, TensorBoard and wandb as configured). Every sink is optional
except metrics.jsonl's role as the record of the run: a sink that fails when it is opened or
while writing is reported once and switched off (trainer/metrics.py `MetricsLogger`), and
training goes on.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainer.ds.engine import Job
from trainer.metrics import Sink, Warn, read_metrics, stderr_warn
from trainer.run_dir import RunDir
from trainer.secrets import scrub_secrets
from trainer.state import TrainState


def _fmt(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4f}"


def _plain_line(step: int, values: Mapping[str, float]) -> str:
    """`step N key=value ...`: the console format that scripts and tests grep."""
    parts = " ".join(f"{k}={_fmt(v)}" for k, v in values.items())
    return f"step {step} {parts}"


class ConsoleSink:
    """Rank 0's console: a tqdm bar with ETA on a terminal, plain `step N k=v` lines otherwise.

    On a terminal, records with validation results are also printed as plain lines above the bar,
    so the evaluation history stays on screen.
    """

    name = "console"
    BAR_KEYS = ("loss", "lr", "tokens_per_s", "mfu")

    def __init__(
        self,
        stream: Any = None,
        total_steps: int | None = None,
        start_step: int = 0,
        progress_bar: bool | None = None,
    ) -> None:
        self.stream = stream or sys.stdout
        if progress_bar is None:
            progress_bar = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bar: Any = None
        if progress_bar:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_steps,
                initial=start_step,
                file=self.stream,
                unit="step",
                dynamic_ncols=True,
                smoothing=0.1,
            )

    def write(self, step: int, values: dict[str, float]) -> None:
        if self.bar is None:
            print(_plain_line(step, values), file=self.stream, flush=True)
            return
        if "horizon" in values:  # a budget fixed the run's last step (trainer/budget.py)
            self.bar.total = int(values["horizon"])
        self.bar.update(step - self.bar.n)
        shown = {k: _fmt(values[k]) for k in self.BAR_KEYS if k in values}
        if shown:
            self.bar.set_postfix(shown, refresh=True)
        if any(k.startswith("valid_") or k == "bleu" for k in values):
            self.bar.write(_plain_line(step, values), file=self.stream)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class JsonlSink:
    """Appends one JSON object per logged step; on resume, records past the resumed step are
    cut so the file continues without duplicated steps."""

    name = "jsonl"

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = path
        if resume_step is not None and path.exists():
            kept = [r for r in read_metrics(path) if r["step"] <= resume_step]
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.file = path.open("a")

    def write(self, step: int, values: dict[str, float]) -> None:
        record = {"step": step, "time": round(time.time(), 3)}
        record.update(
            {
                k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in values.items()
            }
        )
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def tensorboard_tag(key: str) -> str:
    """Group keys into TensorBoard sections: train/, valid/, system/."""
    if key.startswith("valid_") or key == "bleu":
        return f"valid/{key.removeprefix('valid_')}"
    if key.startswith("mem_") or key.startswith("samples_"):
        return f"system/{key}"
    return f"train/{key}"


class TensorBoardSink:
    """Scalars into RUN/tb. On resume, events at or past the first new step are purged, so
    TensorBoard shows one curve without the steps the crashed run logged after its checkpoint."""

    name = "tensorboard"

    def __init__(self, log_dir: Path, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            str(log_dir),
            purge_step=None if resume_step is None else resume_step + 1,
            flush_secs=30,
        )

    def write(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(tensorboard_tag(key), value, step)

    def close(self) -> None:
        self.writer.close()


def _ensure_writable_dir(path: Path) -> None:
    """Create `path` and prove it takes a file; raises OSError otherwise. wandb itself falls
    back to a temp dir silently, which would put the run outside the run dir."""
    path.mkdir(parents=True, exist_ok=True)
    probe = path / ".write-test"
    probe.write_text("")
    probe.unlink()


class WandbSink:
    """wandb in online/offline mode; the run id is kept so a resumed run continues it.

    The config is logged without secrets (see `scrub_secrets`); git, code and system metadata
    collection is off, so nothing from the environment is copied into the run files.
    """

    name = "wandb"

    def __init__(
        self, run_dir: Path, mode: str, project: str, name: str, run_id: str, config: dict
    ) -> None:
        import wandb

        _ensure_writable_dir(RunDir(run_dir).wandb)
        self.run = wandb.init(
            dir=str(run_dir),
            mode=mode,
            project=project,
            name=name,
            id=run_id,
            resume="allow",
            config=scrub_secrets(config),
            settings=wandb.Settings(
                silent=True,
                console="off",
                x_disable_stats=True,
                x_disable_meta=True,
                disable_git=True,
                disable_code=True,
                save_code=False,
                x_save_requirements=False,
            ),
        )

    def write(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def open_sink(name: str, factory: Callable[[], Sink], warn: Warn = stderr_warn) -> Sink | None:
    """`factory()`, or None after one warning line when the sink cannot be opened."""
    try:
        return factory()
    except Exception as exc:
        warn(f"warning: metrics sink '{name}' failed and is switched off: {exc}")
        return None


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
