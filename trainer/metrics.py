"""Metrics sinks: console, metrics.jsonl and wandb; a failing sink is switched off, not fatal."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Protocol


class Sink(Protocol):
    name: str

    def write(self, step: int, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _fmt(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4f}"


class ConsoleSink:
    name = "console"

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout

    def write(self, step: int, values: dict[str, float]) -> None:
        parts = " ".join(f"{k}={_fmt(v)}" for k, v in values.items())
        print(f"step {step} {parts}", file=self.stream, flush=True)

    def close(self) -> None:
        pass


class JsonlSink:
    """Appends one JSON object per logged step; on resume, lines past the resumed step are cut
    so the file continues without duplicated steps."""

    name = "jsonl"

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = path
        if resume_step is not None and path.exists():
            kept = [
                line
                for line in path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            path.write_text("".join(line + "\n" for line in kept))
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


class WandbSink:
    """wandb in online/offline mode; the run id is kept so a resumed run continues it."""

    name = "wandb"

    def __init__(
        self, run_dir: Path, mode: str, project: str, name: str, run_id: str, config: dict
    ) -> None:
        import wandb

        self.run = wandb.init(
            dir=str(run_dir),
            mode=mode,
            project=project,
            name=name,
            id=run_id,
            resume="allow",
            config=config,
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def write(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLogger:
    """Fans each record out to every sink; a sink that raises is reported once and dropped."""

    def __init__(self, sinks: list[Sink], warn: Any = None) -> None:
        self.sinks = list(sinks)
        self.warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))

    def log(self, step: int, values: dict[str, float]) -> None:
        for sink in list(self.sinks):
            try:
                sink.write(step, values)
            except Exception as exc:
                self._drop(sink, exc)

    def _drop(self, sink: Sink, exc: Exception) -> None:
        self.warn(f"warning: metrics sink '{sink.name}' failed and is switched off: {exc}")
        self.sinks.remove(sink)

    def close(self) -> None:
        for sink in list(self.sinks):
            try:
                sink.close()
            except Exception as exc:
                self._drop(sink, exc)
