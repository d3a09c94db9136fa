"""What a run logs and where it goes: the memory and throughput figures, the logger that fans
each record out to the sinks (trainer/sinks.py) and drops one that fails, and the one reader of
metrics.jsonl.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # torch only where a device is measured: `paperscale status` reads metrics
    import torch

Warn = Callable[[str], None]


class Sink(Protocol):
    name: str

    def write(self, step: int, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def stderr_warn(message: str) -> None:
    """The default way a sink problem is reported: one line on stderr."""
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- memory


def host_rss_gb() -> float:
    """Resident memory of this process in GiB (VmRSS; the peak from getrusage off Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20  # kB -> GiB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def memory_metrics(device: torch.device) -> dict[str, float]:
    """Host RSS, plus allocated and reserved GPU memory when training on CUDA (GiB)."""
    out = {"mem_rss_gb": host_rss_gb()}
    if device.type == "cuda":
        import torch

        out["mem_gpu_alloc_gb"] = torch.cuda.memory_allocated(device) / 2**30
        out["mem_gpu_reserved_gb"] = torch.cuda.memory_reserved(device) / 2**30
        out["mem_gpu_peak_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


# ---------------------------------------------------------------------------- throughput


class Throughput:
    """Training wall time between two log points, with evaluation and checkpoints left out."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.excluded = 0.0

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside this block does not count as training time."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - t0

    def lap(self) -> float:
        """Seconds of training since the previous lap (or construction); starts the next."""
        now = time.perf_counter()
        elapsed = now - self.start - self.excluded
        self.start, self.excluded = now, 0.0
        return max(elapsed, 1e-9)


Record = dict[str, Any]


def read_metrics(path: Path) -> list[Record]:
    """The records of a metrics.jsonl file (the one reader of that format), skipping a line
    cut short by a crash mid-write; [] when the file does not exist."""
    if not path.is_file():
        return []
    out: list[Record] = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
            out.append(record)
    return out


class MetricsLogger:
    """Fans each record out to every sink; a sink that raises is reported once and dropped."""

    def __init__(self, sinks: list[Sink], warn: Warn | None = None) -> None:
        self.sinks = list(sinks)
        self.warn = warn or stderr_warn

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
