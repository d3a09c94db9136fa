"""How fast a rank computes a training step, for `paperscale plan`: measured on this machine (a
calibration file written by `paperscale calibrate --out FILE`) or assumed for a
device that was not measured.

The step time model:

    step_s = FLOPs the step's micro-batches compute / (ranks x rate)
             + overhead_s + accum x overhead_micro_s

where `rate` is one rank's effective rate on the model's matmuls (peak x MFU) and the overheads
the time that does not grow with the tokens: per optimizer step (the optimizer, the gradient
reduction) and per micro-batch (kernel launches, elementwise work, the loss's (V, d) projection
gradient). The calibration measures all three on the machine at hand from steps of one and two
micro-batches of several sizes (launch/cost_model/calibrate.py); one process, so without the
gradient reduction between ranks.

A GPU model the `gpu` bench measured (MEASURED_GPUS) is planned at its measured end-to-end
MFU; another one training in bf16 at that MFU on its own peak, by the ratio of the peaks
(scaled_gpu_speed: the nearest measured peak is the reference). With `--mfu` or
`--overhead-ms`, or in fp16 (V100, T4: nothing measured in that precision), the rate is the
peak (trainer/flops.py's table, or `--peak-tflops`) x `--mfu`, and the overhead
ASSUMED_OVERHEAD_S per step (none per micro-batch) unless `--overhead-ms` says otherwise: about
1,200 kernels of one big-model micro-batch at ~5 us of launch each (6 ms, hidden only where
kernels are long) and the fused Adam pass over the fp32 states (~2 ms on HBM3). An estimate, not
a measurement; the plan says so in its output. Between GPU ranks the gradients' synchronisation
is priced on top, from its bytes and links (launch/cost_model/comm.py: ~2 ms for the big model
on 8 NVLink GPUs). Checked against MLPerf v0.7's DGX A100 log
(launch/cost_model/quality.py): at A100's datasheet peak, MFU 0.4 and this overhead the plan
gives 0.153 s per step of 110,592 tokens (0.140 s with `--fill 0.91`, the share of the budget
its batches held), where the log shows 0.130 s (472 s for 3,632 steps, with evaluation).
"""

from __future__ import annotations

import json
import math
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ASSUMED_MFU = 0.4
ASSUMED_OVERHEAD_S = 0.008


@dataclass(frozen=True)
class GpuMeasurement:
    """A GPU model's step measured end to end by the `gpu` bench (bench/RESULTS.md, section
    gpu): model FLOPs / step time / the table's peak, every overhead of one GPU's step inside."""

    mfu_eager: float
    mfu_compiled: float
    where: str


# The big model at ~25k tokens per side, bf16, ZeRO 1, one GPU: the MFU at the paper's batch (a
# larger micro-batch computes at a higher one, so the plan errs slow there). Ranks > 1 add the
# gradients' synchronisation (launch/cost_model/comm.py).
MEASURED_GPUS = {
    "H200": GpuMeasurement(
        0.235, 0.319, "bench gpu on one H200, 2026-12-04: 360k tokens/s eager, 489k compiled"
    ),
}
CALIBRATION_FORMAT = 1  # bumped when the file's meaning changes


@dataclass(frozen=True)
class Calibration:
    """What `paperscale calibrate` measured on one machine (one rank's process)."""

    path: str
    device: str  # cpu | cuda
    device_name: str
    gpu_key: str | None  # trainer/flops.py's table entry for a CUDA device, else None
    precision: str
    threads: int
    flops_per_s: float  # effective training FLOP/s of one rank (trainer/flops.py's count)
    overhead_s: float  # per optimizer step
    overhead_micro_s: float  # per micro-batch (the rest of the intercept)
    peak_flops: float | None  # the device's matmul peak at the precision, when known
    model: dict[str, int]  # the shapes it measured (the rate depends on them)
    memory_gib: float | None  # the GPU's memory, or the host's for a CPU (shared by its ranks)
    # the steps it timed: (micro-batch tokens, micro-batches, seconds), its check's included
    steps: tuple[tuple[int, int, float], ...] = ()
    startup_s: float = 0.0  # the engine built, its first step's extra (cost_model/run_time.py)
    events: EventTimings | None = None  # its validation pass and decodes, where it timed them
    ranks: int = 1  # the local ranks of the world it timed in (calibrate --ranks)


@dataclass(frozen=True)
class EventTimings:
    """A calibration's timings of the trainer's validation pass and decodes on the config's
    prepared validation split, in a world of one (launch/cost_model/calibrate.py)."""

    valid_samples: int
    eval_max_batches: int
    eval_s: float
    bleu_beam: int
    decodes: tuple[tuple[int, float], tuple[int, float]]  # (sentences, seconds): half, all
    world: int = 1  # the ranks that shared the split and the sentences (calibrate --ranks)


def _number(raw: dict[str, Any], key: str, minimum: float, path: str) -> float:
    """raw[key] as a finite float >= minimum, else ValueError naming the file and key."""
    value = raw.get(key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{path}: {key} must be a number >= {minimum:g}, got {value!r}")
    return float(value)


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration file; ValueError (one line) when it is not one."""
    name = str(path)
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{name}: cannot read a calibration: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != CALIBRATION_FORMAT:
        raise ValueError(
            f"{name}: not a calibration of format {CALIBRATION_FORMAT} "
            "(paperscale calibrate --out FILE writes one)"
        )
    if raw.get("device") not in ("cpu", "cuda") or raw.get("precision") not in (
        "bf16",
        "fp16",
        "fp32",
    ):
        raise ValueError(f"{name}: device must be cpu or cuda and precision bf16, fp16 or fp32")
    peak = raw.get("peak_flops")
    return Calibration(
        path=name,
        device=raw["device"],
        device_name=str(raw.get("device_name") or raw["device"]),
        gpu_key=raw.get("gpu_key") or None,
        precision=raw["precision"],
        threads=int(_number(raw, "threads", 1, name)),
        flops_per_s=_number(raw, "flops_per_s", 1.0, name),
        overhead_s=_number(raw, "overhead_s", 0.0, name),
        overhead_micro_s=_number(raw, "overhead_micro_s", 0.0, name)
        if raw.get("overhead_micro_s") is not None
        else 0.0,
        peak_flops=_number(raw, "peak_flops", 1.0, name) if peak is not None else None,
        model={k: int(v) for k, v in dict(raw.get("model") or {}).items()},
        memory_gib=_number(raw, "memory_gib", 0.0, name) if raw.get("memory_gib") else None,
        steps=timed_steps(raw),
        startup_s=sum(_number(raw["startup"], k, 0.0, name) for k in raw["startup"])
        if isinstance(raw.get("startup"), dict)
        else 0.0,
        events=event_timings(raw.get("events"), name),
        ranks=int(_number(raw, "ranks", 1, name)) if raw.get("ranks") is not None else 1,
    )


def event_timings(raw: Any, name: str) -> EventTimings | None:
    """A calibration file's `events` (None where it has none); ValueError naming a bad one."""
    if raw is None:
        return None
    try:
        d = raw["decode"]
        return EventTimings(
            valid_samples=int(_number(raw, "valid_samples", 1, name)),
            eval_max_batches=int(_number(raw, "eval_max_batches", 0, name)),
            eval_s=_number(raw, "eval_s", 0.0, name),
            bleu_beam=int(_number(raw, "bleu_beam", 1, name)),
            decodes=(
                (int(_number(d, "small", 0, name)), _number(d, "small_s", 0.0, name)),
                (int(_number(d, "large", 1, name)), _number(d, "large_s", 0.0, name)),
            ),
            world=int(_number(raw, "world", 1, name)) if raw.get("world") is not None else 1,
        )
    except (KeyError, TypeError):
        raise ValueError(f"{name}: events must hold eval_s and decode timings") from None


def timed_steps(raw: dict[str, Any]) -> tuple[tuple[int, int, float], ...]:
    """A calibration file's timed steps (its points and its check at the config's batch)."""
    found = [*(raw.get("points") or []), *([raw["check"]] if raw.get("check") else [])]
    try:
        return tuple(
            (int(p["micro_tokens"]), int(p["grad_accum"]), float(p["step_s"])) for p in found
        )
    except (KeyError, TypeError, ValueError):
        return ()


@dataclass(frozen=True)
class Speed:
    """One rank's speed as the plan uses it, and the one line that says where it is from."""

    name: str
    measured: bool
    peak_flops: float
    mfu: float
    overhead_s: float
    overhead_micro_s: float
    line: str
    device: str = "cuda"  # cpu for a calibrated CPU
    # steps timed at given batches on the planned device and model (micro tokens, micro-batches,
    # seconds): a plan of one of these batches takes the time measured, not the model's
    timed: tuple[tuple[int, int, float], ...] = ()

    @property
    def rate(self) -> float:
        """Effective FLOP/s of one rank."""
        return self.peak_flops * self.mfu


def format_rate(flops_per_s: float) -> str:
    """'395.6 TFLOP/s' or '41.2 GFLOP/s'."""
    if flops_per_s >= 1e12:
        return f"{flops_per_s / 1e12:,.1f} TFLOP/s"
    return f"{flops_per_s / 1e9:,.1f} GFLOP/s"


def measured_speed(
    cal: Calibration, model: dict[str, int] | None = None, ranks_per_node: int | None = None
) -> Speed:
    """The calibration's rate and overheads; notes a model other than the one it measured, and
    on a CPU a plan of another number of ranks on the machine than it timed beside each other."""
    peak = cal.peak_flops or cal.flops_per_s
    share = f" ({cal.flops_per_s / peak:.0%} of its {format_rate(peak)} matmul peak)"
    line = (
        f"{cal.device_name}: measured here ({cal.path}): {format_rate(cal.flops_per_s)} per "
        f"rank{share if cal.peak_flops else ''}, overhead {cal.overhead_s * 1e3:.1f} ms per "
        f"step + {cal.overhead_micro_s * 1e3:.1f} ms per micro-batch, {cal.precision}, "
        f"{cal.threads} thread{'s' if cal.threads > 1 else ''} per rank"
    )
    if model is not None and cal.model and any(cal.model.get(k) != v for k, v in model.items()):
        line += f" (measured on d_model {cal.model.get('d_model')}: the rate depends on shapes)"
    if cal.device == "cpu" and ranks_per_node is not None and ranks_per_node != cal.ranks:
        line += (
            f"; timed as {cal.ranks} rank(s) on the machine, this plan puts "
            f"{ranks_per_node} on it (`calibrate --ranks {ranks_per_node}` times them together)"
        )
    rate, overheads = cal.flops_per_s, (cal.overhead_s, cal.overhead_micro_s)
    same_model = model is None or all(cal.model.get(k) == v for k, v in model.items())
    timed = cal.steps if same_model else ()
    return Speed(cal.device_name, True, peak, rate / peak, *overheads, line, cal.device, timed)


def assumed_speed(
    name: str, peak_flops: float, mfu: float, overhead_s: float, why: str = ""
) -> Speed:
    """A device not measured here: its peak x MFU and an assumed overhead, said in one line."""
    line = (
        f"{name}: not measured here; assumed peak {peak_flops / 1e12:g} TFLOP/s, MFU {mfu:.2f}, "
        f"overhead {overhead_s * 1e3:g} ms per step" + (f" ({why})" if why else "")
    )
    return Speed(name, False, peak_flops, mfu, overhead_s, 0.0, line)


def gpu_measured_speed(
    name: str, peak_flops: float, measured: GpuMeasurement, compiled: bool, why: str = ""
) -> Speed:
    """A GPU model measured here by the `gpu` bench: its end-to-end MFU (one GPU's step; the
    synchronisation between ranks is priced by launch/cost_model/comm.py)."""
    mfu, tail = _measured_parts(measured, compiled, why)
    line = (
        f"{name}: MFU {mfu:.3f} of its {peak_flops / 1e12:g} TFLOP/s peak measured end to end "
        f"({'torch.compile' if compiled else 'eager'}; {measured.where}; bench/RESULTS.md), "
        f"overheads of one GPU's step included{tail}"
    )
    return Speed(name, True, peak_flops, mfu, 0.0, 0.0, line)


def _measured_parts(measured: GpuMeasurement, compiled: bool, why: str) -> tuple[float, str]:
    """(MFU, the line's tail)."""
    mfu = measured.mfu_compiled if compiled else measured.mfu_eager
    return mfu, f" ({why})" if why else ""


def scaled_gpu_speed(
    name: str, peak_flops: float, reference: str, reference_peak: float,
    measured: GpuMeasurement, compiled: bool, why: str = "",
) -> Speed:  # fmt: skip
    """A GPU model nobody measured here, planned from one the `gpu` bench measured by the ratio
    of their peaks: the reference's end-to-end MFU at this GPU's own peak (the same software
    doing the same work, at the speed of the other chip's matmuls). Not a measurement; marked
    so (`speed_measured` false)."""
    mfu, tail = _measured_parts(measured, compiled, why)
    line = (
        f"{name}: not measured here; planned from {reference}'s measured MFU {mfu:.3f} "
        f"({'torch.compile' if compiled else 'eager'}; {measured.where}) at its own peak "
        f"{peak_flops / 1e12:g} TFLOP/s, by the ratio of peaks ({reference_peak / 1e12:g} / "
        f"{peak_flops / 1e12:g}){tail}"
    )
    return Speed(name, False, peak_flops, mfu, 0.0, 0.0, line)


def calibration_applies(cal: Calibration, gpu_key: str | None, precision: str) -> str:
    """Why `cal` does not describe the planned device and precision ('' when it does).

    Without --gpu the plan is for the machine at hand, which the calibration measured; with
    --gpu NAME only a calibration taken on that GPU model counts. `precision` is the config's
    train.precision (auto takes the calibration's).
    """
    if gpu_key is not None and cal.gpu_key != gpu_key:
        return f"the calibration {cal.path} is for {cal.device_name}"
    if precision not in ("auto", cal.precision):
        return f"the calibration {cal.path} measured {cal.precision}, not {precision}"
    return ""


def cpu_model() -> str:
    """The CPU's model name, from lscpu, else /proc/cpuinfo, else the platform module."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.strip().startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
