"""`train.precision: auto`: the CUDA capability rule, the CPU flags + the measurement made once
per machine (with its margin and its cache), the switch, the warning on a forced bf16, and what
a resumed run does when the machine would pick another."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.machine_cache import MachineCache, machine_key
from trainer.precision import (
    BF16_MIN_SPEEDUP,
    CPU_BF16_ENV,
    CpuBf16Verdict,
    PrecisionChoice,
    cached_bf16_slowdown,
    cpu_bf16_verdict,
    cpu_has_native_bf16,
    cuda_precision,
    forced_cpu_bf16,
    machine_choice,
    measure_bf16_slowdown,
    resolve_precision,
    runs_on,
    shape_class,
    slow_bf16_warning,
)

NATIVE = {"avx512_bf16": True, "amx_bf16": False, "avx2": True}
AVX2_ONLY = {"avx512_bf16": False, "amx_bf16": False, "avx2": True}


@pytest.mark.parametrize(
    ("capability", "name", "expected"),
    [
        ((6, 0), "Tesla P100-PCIE-16GB", "fp16"),
        ((7, 0), "Tesla V100-SXM2-32GB", "fp16"),
        ((7, 5), "Tesla T4", "fp16"),
        ((8, 0), "NVIDIA A100-SXM4-80GB", "bf16"),
        ((8, 6), "NVIDIA A10", "bf16"),
        ((8, 9), "NVIDIA L4", "bf16"),
        ((9, 0), "NVIDIA H200", "bf16"),
        ((10, 0), "NVIDIA B200", "bf16"),
    ],
)
def test_cuda_rule_is_bf16_from_capability_8(
    capability: tuple[int, int], name: str, expected: str
) -> None:
    choice = cuda_precision(capability, name)
    assert choice.precision == expected
    assert name in choice.reason and f"{capability[0]}.{capability[1]}" in choice.reason
    via_machine = machine_choice("cuda", 512, 2048, cuda_capability=capability, cuda_name=name)
    assert via_machine == choice


def test_cpu_flags_both_ways() -> None:
    assert cpu_has_native_bf16(NATIVE)
    assert cpu_has_native_bf16({"amx_bf16": True})
    assert cpu_has_native_bf16({"bf16": True})  # Arm FEAT_BF16
    assert not cpu_has_native_bf16(AVX2_ONLY)
    assert not cpu_has_native_bf16({})


def test_this_machines_flags_agree_with_proc_cpuinfo() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.fail("needs /proc/cpuinfo (Linux)")
    flags = set(cpuinfo.read_text().split())
    assert cpu_has_native_bf16() == bool({"avx512_bf16", "amx_bf16"} & flags)


@pytest.mark.parametrize(
    ("caps", "slowdown", "expected"),
    [
        (NATIVE, 0.5, "bf16"),  # native and measured 2x faster
        (NATIVE, 1 / BF16_MIN_SPEEDUP, "bf16"),  # exactly the margin
        (NATIVE, 0.7, "fp32"),  # faster, but within the margin: a near-tie goes to fp32
        (NATIVE, 1.0, "fp32"),  # a tie
        (NATIVE, 3.0, "fp32"),  # flags present but the probe finds bf16 slower
        (AVX2_ONLY, 0.5, "fp32"),  # no flags: never bf16, and nothing measured
    ],
)
def test_cpu_rule_needs_flags_and_a_margin(
    caps: dict[str, bool], slowdown: float, expected: str
) -> None:
    probed: list[tuple[int, int]] = []

    def probe(d: int, f: int) -> tuple[float, bool]:
        probed.append((d, f))
        return slowdown, True

    verdict = cpu_bf16_verdict(256, 1024, {}, caps, probe=probe)
    assert ("bf16" if verdict.use_bf16 else "fp32") == expected
    assert probed == ([(256, 1024)] if caps is NATIVE else [])
    choice = machine_choice("cpu", 256, 1024, {}, cpu_verdict=lambda d, f, e: verdict)
    assert choice.precision == expected


def test_reason_says_flags_or_the_cached_measurement() -> None:
    emulated = CpuBf16Verdict(native_flags=False, slowdown=None, forced=None)
    line = PrecisionChoice("fp32", emulated.describe()).line()
    assert line.startswith(
        "precision auto -> fp32: this CPU has no native bf16 instructions (avx512_bf16, amx_bf16)"
    )
    native = CpuBf16Verdict(native_flags=True, slowdown=0.5, forced=None, cached=True)
    assert native.describe() == (
        "this CPU has native bf16 (bf16 matmul 2.0x the speed of fp32, measured once on this "
        "machine, cached)"
    )
    tie = CpuBf16Verdict(native_flags=True, slowdown=0.8, forced=None)
    assert tie.describe() == (
        "this CPU has bf16 instructions but bf16 matmul 1.2x the speed of fp32 (measured once "
        f"on this machine); bf16 needs {BF16_MIN_SPEEDUP}x"
    )
    near = CpuBf16Verdict(native_flags=True, slowdown=0.642, forced=None)  # 1.558x: just short
    assert not near.use_bf16 and "bf16 matmul 1.56x the speed of fp32" in near.describe()


@pytest.mark.parametrize(
    ("value", "caps", "expected"),
    [("1", AVX2_ONLY, "bf16"), ("0", NATIVE, "fp32"), ("", AVX2_ONLY, "fp32")],
)
def test_switch_forces_the_cpu_answer(value: str, caps: dict[str, bool], expected: str) -> None:
    verdict = cpu_bf16_verdict(
        256, 1024, {CPU_BF16_ENV: value}, caps, probe=lambda d, f: pytest.fail("measured")
    )
    assert ("bf16" if verdict.use_bf16 else "fp32") == expected
    if value:
        assert f"{CPU_BF16_ENV}={value}" in verdict.describe()


def test_switch_rejects_other_values() -> None:
    assert forced_cpu_bf16({}) is None
    with pytest.raises(ValueError, match=CPU_BF16_ENV):
        forced_cpu_bf16({CPU_BF16_ENV: "yes"})


def test_probe_measures_a_real_ratio() -> None:
    ratio = measure_bf16_slowdown(64, 128, rows=64, budget_s=0.2)
    assert 0.01 < ratio < 1000


def test_shape_classes_round_up_to_powers_of_two_and_cap() -> None:
    assert shape_class(32, 64) == (32, 64)
    assert shape_class(48, 100) == (64, 128)
    assert shape_class(512, 2048) == (512, 2048)
    assert shape_class(4096, 16384) == (1024, 4096)


def test_the_measurement_is_made_once_per_machine_and_shape_class(tmp_path: Path) -> None:
    cache = MachineCache(tmp_path)
    first, cached = cached_bf16_slowdown(32, 64, cache)
    assert not cached and 0.01 < first < 1000
    entries = cache.read()
    assert len(entries) == 1
    (key,) = entries
    assert "torch " in key and "256x32 @ 32x64" in key
    again, cached = cached_bf16_slowdown(30, 60, cache)  # same class: read back, not measured
    assert cached and again == first
    cached_bf16_slowdown(64, 128, cache)
    assert len(cache.read()) == 2


def test_one_model_name_with_other_flags_is_another_machine(tmp_path: Path) -> None:
    """Virtual machines of two CPU generations both called "AMD EPYC" (one AVX2 only, one with
    avx512_bf16) keep their measurements apart; without flags the key is the model's alone."""
    cpu = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2\n\nprocessor\t: 1\n"
    (tmp_path / "zen2").write_text(cpu)
    (tmp_path / "zen4").write_text(cpu.replace("avx2", "avx2 avx512_bf16"))
    (tmp_path / "bare").write_text("processor\t: 0\nmodel name\t: AMD EPYC\n")
    zen2, zen4 = machine_key(tmp_path / "zen2"), machine_key(tmp_path / "zen4")
    assert zen2.startswith("AMD EPYC | cpu ") and zen4.startswith("AMD EPYC | cpu ")
    assert zen2 != zen4 and zen2.endswith(zen4.rsplit(" | ", 1)[1])  # same torch
    assert machine_key(tmp_path / "bare").startswith("AMD EPYC | torch ")


def test_a_damaged_cache_is_measured_again(tmp_path: Path) -> None:
    cache = MachineCache(tmp_path)
    cache.path.write_text("{not json")
    value, cached = cached_bf16_slowdown(32, 64, cache)
    assert not cached and cache.read() and value > 0


def test_forced_bf16_warns_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CPU_BF16_ENV, "0")
    warning = slow_bf16_warning("cpu", 64, 128)
    assert warning is not None and warning.startswith("warning: train.precision=bf16")
    assert "auto picks fp32" in warning and "\n" not in warning
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    assert slow_bf16_warning("cpu", 64, 128) is None
    assert slow_bf16_warning("cuda", 64, 128) is None


FP32_HERE = PrecisionChoice("fp32", "this CPU has no native bf16")
BF16_HERE = PrecisionChoice("bf16", "this CPU has native bf16")


def test_resume_keeps_the_checkpoints_precision_and_says_why() -> None:
    kept = resolve_precision("auto", "cpu", 256, 1024, saved="bf16", choose=lambda: FP32_HERE)
    assert kept.precision == "bf16"
    assert kept.line().startswith("precision auto -> bf16: continuing in the checkpoint's")
    assert "would pick fp32" in kept.reason
    other = resolve_precision("auto", "cpu", 256, 1024, saved="fp32", choose=lambda: BF16_HERE)
    assert other.precision == "fp32" and "would pick bf16" in other.reason
    same = resolve_precision("auto", "cpu", 256, 1024, saved="fp32", choose=lambda: FP32_HERE)
    assert same == FP32_HERE


def test_fp16_checkpoint_cannot_resume_without_a_gpu() -> None:
    assert not runs_on("fp16", "cpu") and runs_on("fp16", "cuda") and runs_on("bf16", "cpu")
    with pytest.raises(ValueError, match="saved in fp16, which needs a GPU"):
        resolve_precision("auto", "cpu", 256, 1024, saved="fp16", choose=lambda: FP32_HERE)


def test_explicit_precision_is_taken_as_given() -> None:
    choice = resolve_precision("bf16", "cpu", 256, 1024, choose=lambda: FP32_HERE)
    assert choice.precision == "bf16"
