"""`train.precision: auto`: the compute precision this machine trains fastest in, and why.

The rule, from stable facts first:
- CUDA: bf16 where the device computes it natively (compute capability >= 8.0: A100, H100,
  H200, L4, ...), else fp16 with DeepSpeed's dynamic loss scaling (V100, T4, P100).
- CPU without native bf16 instructions (no x86 `avx512_bf16` / `amx_bf16`, no Arm `bf16`):
  fp32, from the flags alone. torch emulates bf16 there, 20-70x slower than fp32.
- CPU with them: bf16 only where a bf16 matmul at the model's feed-forward shape is measured at
  least BF16_MIN_SPEEDUP (1.6x) as fast as fp32; a nearer call goes to fp32, the fixed default.
  At small widths bf16 loses even on AMX (d_model 32: 2.6-4.7x slower), at the demo's 128 it
  wins by 2-2.6x, near 64 it is a tie. The measurement is made once per CPU model, torch version
  and shape class (warmed, on one thread, the median of several alternating rounds) and kept in
  the machine cache (trainer/machine_cache.py); every later start reads it.
- `PAPERSCALE_CPU_BF16=1|0` forces the CPU answer (tests, benches and demos use it to take
  either path on any machine).

A run keeps the precision its first start decided (trainer/autos.py, RUN/decisions.json), and a
resumed run the checkpoint's, and says so when this machine alone would pick another.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainer.machine_cache import MachineCache, default_cache, machine_key

PRECISIONS = ("bf16", "fp16", "fp32")
CPU_BF16_ENV = "PAPERSCALE_CPU_BF16"
CUDA_BF16_CAPABILITY = (8, 0)  # Ampere and newer compute bf16 in their tensor cores
PROBE_ROWS = 256  # rows of the probe's (rows, d_model) @ (d_model, d_ff) matmul
BF16_MIN_SPEEDUP = 1.6  # bf16 on a CPU only where measured at least this much faster than fp32


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
    slowdown: float | None  # bf16 matmul time / fp32 matmul time; None: not measured
    forced: bool | None  # the value of PAPERSCALE_CPU_BF16, when set
    cached: bool = False  # the slowdown was read from the machine cache

    @property
    def use_bf16(self) -> bool:
        if self.forced is not None:
            return self.forced
        return (
            self.native_flags
            and self.slowdown is not None
            and self.slowdown * BF16_MIN_SPEEDUP <= 1.0
        )

    def measured(self) -> str:
        """'bf16 matmul 2.0x the speed of fp32' or '... 3x slower than fp32', or ''."""
        if self.slowdown is None:
            return ""
        if self.slowdown >= 1.5:
            return f"bf16 matmul {self.slowdown:.0f}x slower than fp32"
        speedup = 1 / self.slowdown
        digits = 2 if round(speedup, 1) == BF16_MIN_SPEEDUP else 1  # 1.56 is not 1.6
        return f"bf16 matmul {speedup:.{digits}f}x the speed of fp32"

    def describe(self) -> str:
        """Why, in a few words: 'this CPU has no native bf16 instructions (...)'."""
        if self.forced is not None:
            what = "native" if self.forced else "no native"
            return f"{CPU_BF16_ENV}={int(self.forced)} forces {what} bf16"
        if not self.native_flags:
            return (
                "this CPU has no native bf16 instructions (avx512_bf16, amx_bf16), where torch "
                "emulates bf16 many times slower than fp32"
            )
        when = "measured once on this machine" + (", cached" if self.cached else "")
        if self.use_bf16:
            return f"this CPU has native bf16 ({self.measured()}, {when})"
        return (
            f"this CPU has bf16 instructions but {self.measured()} ({when}); bf16 needs "
            f"{BF16_MIN_SPEEDUP}x"
        )


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


def shape_class(d_model: int, d_ff: int) -> tuple[int, int]:
    """The probe's (k, n): each rounded up to a power of two and capped (1024, 4096), so that
    nearby shapes share one measurement."""

    def up(x: int, cap: int) -> int:
        return min(1 << max(0, int(x) - 1).bit_length(), cap)

    return up(d_model, 1024), up(d_ff, 4096)


def _best_seconds(fn: Callable[[], object], calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_bf16_slowdown(
    d_model: int, d_ff: int, rows: int = PROBE_ROWS, rounds: int = 7, budget_s: float = 3.0
) -> float:
    """Time of a bf16 matmul over that of the same fp32 one at (rows, k) @ (k, n), the shape
    class of the model's feed-forward layer; < 1 means bf16 is faster.

    Measured on one thread (a rank's share of the cores), warmed, as the median over rounds of
    the ratio of the best of three calls each way, fp32 and bf16 alternating, so that another
    process's burst lands on both sides or on one round only. At least three rounds; more while
    `budget_s` lasts.
    """
    import torch

    k, n = shape_class(d_model, d_ff)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, k, generator=gen), torch.randn(k, n, generator=gen)
    a16, b16 = a.bfloat16(), b.bfloat16()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(2):  # warm-up: first-call allocations, kernel choice
            torch.mm(a, b), torch.mm(a16, b16)
        ratios: list[float] = []
        start = time.perf_counter()
        for i in range(rounds):
            fp32 = _best_seconds(lambda: torch.mm(a, b), 3)
            bf16 = _best_seconds(lambda: torch.mm(a16, b16), 3)
            ratios.append(bf16 / fp32)
            if i + 1 >= 3 and time.perf_counter() - start >= budget_s:
                break
    finally:
        torch.set_num_threads(threads)
    return statistics.median(ratios)


def cached_bf16_slowdown(
    d_model: int, d_ff: int, cache: MachineCache | None = None
) -> tuple[float, bool]:
    """The bf16/fp32 matmul time ratio of this machine at the model's shape class, measured
    once and kept in the machine cache. Returns (ratio, True when read from the cache)."""
    k, n = shape_class(d_model, d_ff)
    key = f"{machine_key()} | cpu bf16/fp32 matmul, 1 thread, {PROBE_ROWS}x{k} @ {k}x{n}"

    def measure() -> dict[str, object]:
        return {"slowdown": measure_bf16_slowdown(d_model, d_ff), "measured_at": time.time()}

    entry, cached = (cache or default_cache()).measured(key, measure)
    return float(entry["slowdown"]), cached


def cpu_bf16_verdict(
    d_model: int,
    d_ff: int,
    environ: Mapping[str, str] | None = None,
    capabilities: Mapping[str, object] | None = None,
    probe: Callable[[int, int], tuple[float, bool]] = cached_bf16_slowdown,
) -> CpuBf16Verdict:
    """The CPU's flags, the override, and (only where the flags leave it open) the slowdown
    measured once on this machine, for the rule above."""
    forced = forced_cpu_bf16(environ)
    native = cpu_has_native_bf16(capabilities)
    if forced is not None or not native:
        return CpuBf16Verdict(native_flags=native, slowdown=None, forced=forced)
    slowdown, cached = probe(d_model, d_ff)
    return CpuBf16Verdict(native_flags=True, slowdown=slowdown, forced=None, cached=cached)


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
    """The one warning line for an explicit bf16 on a CPU that `auto` would train in fp32."""
    if device_type != "cpu":
        return None
    verdict = cpu_bf16_verdict(d_model, d_ff)
    if verdict.use_bf16:
        return None
    return (
        f"warning: train.precision=bf16 where auto picks fp32 ({verdict.describe()}); "
        "this run will be slow"
    )
