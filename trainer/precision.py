"""`train.precision: auto`: the compute precision this machine trains fastest in, and why.

The rule:
- CUDA: bf16 where the device computes it natively (compute capability >= 8.0: A100, H100,
  H200, L4, ...), else fp16 with DeepSpeed's dynamic loss scaling (V100, T4, P100).
- CPU: bf16 only where the CPU has native bf16 instructions (x86 `avx512_bf16` / `amx_bf16`,
  Arm `bf16`) *and* a short probe finds a bf16 matmul at the model's shapes at least as fast as
  an fp32 one; else fp32. Without native support torch emulates bf16, 20-70x slower than fp32.
  `PAPERSCALE_CPU_BF16=1|0` forces the CPU answer (tests, benches and demos use it to take
  either path on any machine).

A run resumed from a checkpoint keeps the checkpoint's precision (its DeepSpeed files and
optimizer states are in that precision) and says so when this machine alone would pick another.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

PRECISIONS = ("bf16", "fp16", "fp32")
CPU_BF16_ENV = "PAPERSCALE_CPU_BF16"
CUDA_BF16_CAPABILITY = (8, 0)  # Ampere and newer compute bf16 in their tensor cores
PROBE_ROWS = 256  # rows of the probe's (rows, d_model) @ (d_model, d_ff) matmul


@dataclass(frozen=True)
class PrecisionChoice:
    """A resolved precision and the one-line reason for it."""

    precision: str
    reason: str

    def line(self, requested: str = "auto") -> str:
        return f"precision {requested} -> {self.precision}: {self.reason}"


@dataclass(frozen=True)
class CpuBf16Verdict:
    """Whether this CPU should train in bf16: flags, the measured slowdown, and any override."""

    native_flags: bool
    slowdown: float | None  # bf16 matmul time / fp32 matmul time at the model's shapes
    forced: bool | None  # the value of PAPERSCALE_CPU_BF16, when set

    @property
    def use_bf16(self) -> bool:
        if self.forced is not None:
            return self.forced
        return self.native_flags and self.slowdown is not None and self.slowdown <= 1.0

    def describe(self) -> str:
        """Why, in a few words: 'this CPU has no native bf16 (bf16 matmul 70x slower ...)'."""
        measured = ""
        if self.slowdown is not None:
            measured = (
                f"bf16 matmul {self.slowdown:.0f}x slower than fp32"
                if self.slowdown >= 1.5
                else f"bf16 matmul {1 / self.slowdown:.1f}x the speed of fp32"
            )
        if self.forced is not None:
            what = "native" if self.forced else "no native"
            return f"{CPU_BF16_ENV}={int(self.forced)} forces {what} bf16" + (
                f" (measured: {measured})" if measured else ""
            )
        if not self.native_flags:
            return "this CPU has no native bf16" + (f" ({measured})" if measured else "")
        if not self.use_bf16:
            return f"this CPU has bf16 instructions but {measured}"
        return f"this CPU has native bf16 ({measured})"


def forced_cpu_bf16(environ: Mapping[str, str] | None = None) -> bool | None:
    """The override in PAPERSCALE_CPU_BF16: True (1), False (0), None (unset).

    Any other value is a ValueError naming the variable, so a typo is not silently ignored.
    """
    value = (os.environ if environ is None else environ).get(CPU_BF16_ENV, "").strip()
    if value == "":
        return None
    if value in ("0", "1"):
        return value == "1"
    raise ValueError(f"{CPU_BF16_ENV} must be 0 or 1, got {value!r}")


def cpu_has_native_bf16(capabilities: Mapping[str, object] | None = None) -> bool:
    """Whether the CPU's instruction set computes bf16 (cpuinfo as torch reports it)."""
    import torch

    caps = torch.cpu.get_capabilities() if capabilities is None else capabilities
    if caps.get("avx512_bf16") or caps.get("amx_bf16"):
        return True
    # Arm: FEAT_BF16 (Graviton 3, Apple M2+, ...), reported as 'bf16' / 'sve_bf16'
    return any(bool(v) for k, v in caps.items() if k in ("bf16", "sve_bf16", "arm_bf16"))


def _best_seconds(fn: Callable[[], object], reps: int, budget_s: float, min_reps: int = 1) -> float:
    """Best wall time of up to `reps` calls of `fn`, stopping early once `budget_s` is spent
    and at least `min_reps` calls are made."""
    best = float("inf")
    start = time.perf_counter()
    for i in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if i + 1 >= min_reps and time.perf_counter() - start >= budget_s:
            break
    return best


def bf16_slowdown(d_model: int, d_ff: int, rows: int = PROBE_ROWS, budget_s: float = 0.5) -> float:
    """Time of a bf16 matmul over the time of the same fp32 one, at the model's feed-forward
    shape (rows, d_model) @ (d_model, d_ff); < 1 means bf16 is faster.

    Each side is warmed up once and timed as the best of a few calls; the bf16 side stops after
    two timed calls when it is slow (emulated bf16 takes ~1 s for the big model's shape), the
    fp32 side, the fast one, after three. One call stalled by another process (the ranks probe
    at the same time) must not decide the ratio: alone, it made bf16 look 390 times faster.
    """
    import torch

    k, n = min(d_model, 1024), min(d_ff, 4096)  # cap the probe's cost for huge models
    a = torch.randn(rows, k)
    b = torch.randn(k, n)
    a16, b16 = a.bfloat16(), b.bfloat16()
    torch.mm(a, b), torch.mm(a16, b16)  # warm-up: first-call allocations, kernel choice
    fp32 = _best_seconds(lambda: torch.mm(a, b), reps=5, budget_s=budget_s / 4, min_reps=3)
    bf16 = _best_seconds(lambda: torch.mm(a16, b16), reps=5, budget_s=budget_s, min_reps=2)
    return bf16 / fp32


def cpu_bf16_verdict(
    d_model: int,
    d_ff: int,
    environ: Mapping[str, str] | None = None,
    capabilities: Mapping[str, object] | None = None,
    probe: Callable[[int, int], float] = bf16_slowdown,
) -> CpuBf16Verdict:
    """The CPU's flags, the measured slowdown, and the override, for the rule above."""
    forced = forced_cpu_bf16(environ)
    native = cpu_has_native_bf16(capabilities)
    return CpuBf16Verdict(native_flags=native, slowdown=probe(d_model, d_ff), forced=forced)


def cuda_precision(capability: tuple[int, int], name: str = "this GPU") -> PrecisionChoice:
    """bf16 on compute capability >= 8.0, else fp16 (with dynamic loss scaling)."""
    cc = f"compute capability {capability[0]}.{capability[1]}"
    if tuple(capability) >= CUDA_BF16_CAPABILITY:
        return PrecisionChoice("bf16", f"{name} ({cc}) computes bf16 natively")
    return PrecisionChoice(
        "fp16", f"{name} ({cc}) has no bf16 tensor cores; fp16 with dynamic loss scaling"
    )


def machine_choice(
    device_type: str,
    d_model: int,
    d_ff: int,
    environ: Mapping[str, str] | None = None,
    cuda_capability: tuple[int, int] | None = None,
    cuda_name: str = "this GPU",
    cpu_verdict: Callable[..., CpuBf16Verdict] = cpu_bf16_verdict,
) -> PrecisionChoice:
    """What `auto` means on this machine, ignoring any checkpoint."""
    import torch

    if device_type == "cuda":
        if cuda_capability is None:
            cuda_capability = torch.cuda.get_device_capability()
            cuda_name = torch.cuda.get_device_name()
        return cuda_precision(cuda_capability, cuda_name)
    verdict = cpu_verdict(d_model, d_ff, environ)
    return PrecisionChoice("bf16" if verdict.use_bf16 else "fp32", verdict.describe())


def runs_on(precision: str, device_type: str) -> bool:
    """fp16 needs a GPU (DeepSpeed's CPU accelerator refuses it); bf16 and fp32 run anywhere."""
    return precision != "fp16" or device_type == "cuda"


def resolve_precision(
    requested: str,
    device_type: str,
    d_model: int,
    d_ff: int,
    saved: str | None = None,
    choose: Callable[[], PrecisionChoice] | None = None,
) -> PrecisionChoice:
    """The precision a run trains in. `saved` is the precision of the checkpoint it resumes.

    `auto` follows the checkpoint when there is one (its optimizer states are in that
    precision); an explicit value is taken as given (the preflight refuses one that differs
    from the checkpoint's). Raises ValueError when the checkpoint's precision cannot run here.
    """
    if requested != "auto":
        return PrecisionChoice(requested, "set in the config")
    pick = (choose or (lambda: machine_choice(device_type, d_model, d_ff)))()
    if saved is None or saved == pick.precision:
        return pick
    if not runs_on(saved, device_type):
        raise ValueError(
            f"the checkpoint was saved in {saved}, which needs a GPU; this machine has none "
            f"(it would pick {pick.precision}: {pick.reason})"
        )
    return PrecisionChoice(
        saved,
        f"continuing in the checkpoint's precision (this machine alone would pick "
        f"{pick.precision}: {pick.reason})",
    )


def slow_bf16_warning(device_type: str, d_model: int, d_ff: int) -> str | None:
    """The one warning line for an explicit bf16 on a CPU without native bf16, else None."""
    if device_type != "cpu":
        return None
    verdict = cpu_bf16_verdict(d_model, d_ff)
    if verdict.use_bf16:
        return None
    return (
        f"warning: train.precision=bf16 on a CPU without native bf16 ({verdict.describe()}); "
        "this run will be slow (train.precision=auto picks fp32 here)"
    )
