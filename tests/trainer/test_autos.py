"""Every `auto` decided once and kept: the record a run's first start writes, what later starts
do with it, and one answer in a row of resolutions beside busy processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.common import busy_processes
from data_pipeline.config import DataConfig, workers_for
from trainer import autos
from trainer.autos import Decision, Record
from trainer.machine_cache import MachineCache
from trainer.precision import (
    PrecisionChoice,
    cached_bf16_slowdown,
    cpu_bf16_verdict,
    cpu_has_native_bf16,
)

TRAIN = {"device": "auto", "precision": "auto", "attention": "auto", "compile": "auto"}
CPU_COMPILE = "a CPU: compiling costs each rank minutes at its first step, not measured to pay"
FP32_HERE = PrecisionChoice("fp32", "this CPU has no native bf16")
BF16_HERE = PrecisionChoice("bf16", "this CPU has native bf16")
# bf16 with one micro-batch a step (TRAIN's default accumulation): nothing summed, bf16
BF16_VALUES = {
    "precision": "bf16",
    "attention": "math",
    "grad_accum_dtype": "bf16",
    "compile": "false",
}


def resolve(
    record: Record | None, here: PrecisionChoice, saved: str | None = None, **train: str
) -> Record:
    return autos.resolve_all(
        {**TRAIN, **train}, "cpu", 64, 256, record, saved, choose_precision=lambda: here
    )


def test_a_first_start_decides_and_states_each_auto() -> None:
    record = resolve(None, FP32_HERE)
    assert autos.values(record) == {
        "precision": "fp32", "attention": "flash", "grad_accum_dtype": "fp32", "compile": "false"
    }  # fmt: skip
    assert autos.lines(record) == [
        "device auto -> cpu: no CUDA device",
        "precision auto -> fp32: this CPU has no native bf16",
        "attention auto -> flash: fp32 on a CPU, where flash is the faster kernel",
        "grad_accum_dtype auto -> fp32: fp32 training sums its gradients in fp32",
        f"compile auto -> false: {CPU_COMPILE}",
    ]


def test_later_starts_keep_the_record_and_name_the_machines_own_pick(tmp_path: Path) -> None:
    path = tmp_path / "decisions.json"
    autos.write_record(path, resolve(None, BF16_HERE), "machine A")
    first = autos.read_record(path)
    assert first is not None and autos.values(first)["precision"] == "bf16"

    later = resolve(first, FP32_HERE)  # this machine alone would train in fp32
    assert autos.values(later) == {**BF16_VALUES}
    precision = later.decisions["precision"]
    assert precision.line("precision") == (
        "precision auto -> bf16: as the run's first start decided (this CPU has native bf16); "
        "this machine alone would pick fp32: this CPU has no native bf16"
    )
    same = resolve(first, BF16_HERE)
    assert same.decisions["precision"].reason.endswith("(as the run's first start decided)")
    # the run's own config.yaml (restart in place, requeue) holds the resolved value
    requeued = resolve(first, FP32_HERE, precision="bf16", attention="math", compile="False")
    assert requeued.decisions["precision"].requested == "auto"
    assert requeued.decisions["compile"].requested == "auto"
    assert autos.values(requeued) == {**BF16_VALUES}


def test_a_value_set_in_the_config_is_taken_as_given() -> None:
    first = resolve(None, BF16_HERE)
    explicit = resolve(
        first, BF16_HERE, precision="fp32", attention="efficient", compile="True",
        grad_accum_dtype="fp32",
    )  # fmt: skip
    assert explicit.decisions["precision"] == Decision("fp32", "fp32", "set in the config")
    assert explicit.decisions["compile"] == Decision("model", "model", "set in the config")
    assert autos.values(explicit) == {
        "precision": "fp32",
        "attention": "efficient",
        "grad_accum_dtype": "fp32",
        "compile": "model",
    }
    assert autos.lines(explicit) == ["device auto -> cpu: no CUDA device"]


def test_a_run_dir_without_a_record_follows_its_checkpoint() -> None:
    resumed = resolve(None, FP32_HERE, saved="bf16")
    assert resumed.decisions["precision"].value == "bf16"
    assert "continuing in the checkpoint's precision" in resumed.decisions["precision"].reason


def test_a_recorded_fp16_cannot_continue_on_a_cpu() -> None:
    fp16 = Record("cuda", {"precision": Decision("auto", "fp16", "no bf16 tensor cores")})
    with pytest.raises(autos.DecisionError, match=r"trains in fp16 .* needs a GPU"):
        resolve(fp16, FP32_HERE)


def test_the_attention_kernel_is_decided_afresh_on_another_device() -> None:
    on_gpu = Record(
        "cuda",
        {
            "precision": Decision("auto", "bf16", "compute capability 9.0"),
            "attention": Decision("auto", "default", "torch's own choice"),
        },
    )
    here = resolve(on_gpu, FP32_HERE)
    assert autos.values(here) == {**BF16_VALUES}
    assert "decided afresh: the run moved from cuda to cpu" in here.decisions["attention"].reason


def test_compile_auto_is_layers_on_a_gpu_false_on_a_cpu_and_kept_on_that_device() -> None:
    """From the device alone: each layer compiled on a GPU, nothing on a CPU; a run recorded on
    a GPU keeps `layers` there and decides afresh (false) where it moves to a CPU."""
    on_gpu = autos.resolve_all(
        TRAIN, "cuda", 1024, 4096, None, None,
        choose_precision=lambda: PrecisionChoice("bf16", "compute capability 9.0"),
    )  # fmt: skip
    assert on_gpu.decisions["compile"].value == "layers"
    assert "compile auto -> layers: a GPU" in autos.lines(on_gpu)[-1]
    again = autos.resolve_all(
        {**TRAIN, **autos.values(on_gpu)}, "cuda", 1024, 4096, on_gpu, None,
        choose_precision=lambda: PrecisionChoice("bf16", "compute capability 9.0"),
    )  # fmt: skip
    assert again.decisions["compile"].requested == "auto"
    assert again.decisions["compile"].value == "layers"
    moved = resolve(on_gpu, BF16_HERE)
    assert moved.decisions["compile"].value == "false"
    assert "decided afresh: the run moved from cuda to cpu" in moved.decisions["compile"].reason


@pytest.mark.parametrize(
    ("device", "cores", "ranks", "workers"),
    [("cpu", 2, 2, 1), ("cpu", 64, 1, 1), ("cuda", 16, 8, 1), ("cuda", 24, 8, 2),
     ("cuda", 96, 8, 2), ("cuda", 4, 8, 1)],
)  # fmt: skip
def test_loader_workers_auto_from_the_device_cores_and_ranks(
    device: str, cores: int, ranks: int, workers: int
) -> None:
    """One on a CPU; on a GPU one per core a rank has beyond the one driving its device, at
    least 1 and at most 2."""
    n, reason = workers_for(device, cores, ranks)
    assert n == workers
    assert ("GPU ranks" in reason) == (device == "cuda")


def test_loader_workers_auto_is_recorded_and_kept_and_a_set_value_stands() -> None:
    """The first start's pick is kept by the run wherever it continues (the workers deal the
    data: another count is another order); a number in the config is taken as given."""
    first = autos.resolve_all(TRAIN, "cpu", 64, 256, None, None, lambda: FP32_HERE, "auto",
                              pick_workers=lambda: (1, "a CPU"))  # fmt: skip
    assert autos.data_values(first) == {"num_workers": 1}
    assert "num_workers auto -> 1: a CPU" in autos.lines(first)
    assert "num_workers" not in autos.values(first)  # a data key, not a train key
    moved = autos.resolve_all(TRAIN, "cuda", 64, 256, first, None, lambda: BF16_HERE, "auto",
                              pick_workers=lambda: (2, "spare cores"))  # fmt: skip
    kept = moved.decisions["num_workers"]
    assert (kept.value, autos.data_values(moved)) == ("1", {"num_workers": 1})
    assert "this machine alone would pick 2: spare cores" in kept.reason
    given = autos.resolve_all(TRAIN, "cpu", 64, 256, first, None, lambda: FP32_HERE, "3")
    assert given.decisions["num_workers"] == Decision("3", "3", "set in the config")


@pytest.mark.parametrize(("value", "ok"), [("auto", True), (0, True), (2, True), (-1, False),
                                           ("many", False), (True, False)])  # fmt: skip
def test_loader_workers_take_auto_or_a_count(value: object, ok: bool) -> None:
    problems = DataConfig(num_workers=value).problems()  # type: ignore[arg-type]
    assert (problems == []) == ok, problems


def test_a_damaged_record_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "decisions.json"
    path.write_text('{"device": "cpu"}')
    with pytest.raises(autos.DecisionError, match=r"decisions\.json is not a record"):
        autos.read_record(path)


@pytest.fixture
def four_busy_processes() -> Iterator[None]:
    with busy_processes(4):
        yield


SHAPES = {"suite": (32, 64), "near-tie": (64, 256), "demo": (128, 512), "tiny": (256, 1024)}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("flags", ["this machine's", "native bf16"])
def test_twenty_resolutions_beside_busy_processes_give_one_answer(
    four_busy_processes: None, tmp_path: Path, flags: str
) -> None:
    """At the suite's, a near-tie's, the demo's and the tiny preset's shapes, 20 starts in a
    row each, four busy processes beside them: one precision each. With native bf16 flags
    claimed, the measurement path runs on any CPU (measured once, then read back)."""
    caps = None if flags == "this machine's" else {"avx512_bf16": True}
    cache = MachineCache(tmp_path / "cache")
    answers: dict[str, set[str]] = {}
    for name, (d_model, d_ff) in SHAPES.items():

        def choose(d: int = d_model, f: int = d_ff) -> PrecisionChoice:
            verdict = cpu_bf16_verdict(
                d, f, {}, caps, probe=lambda dd, ff: cached_bf16_slowdown(dd, ff, cache)
            )
            return PrecisionChoice("bf16" if verdict.use_bf16 else "fp32", verdict.describe())

        answers[name] = {
            autos.values(autos.resolve_all(TRAIN, "cpu", d_model, d_ff, None, None, choose))[
                "precision"
            ]
            for _ in range(20)
        }
    assert all(len(a) == 1 for a in answers.values()), answers
    measured = len(cache.read())
    native = caps is not None or cpu_has_native_bf16()
    assert measured == (len(SHAPES) if native else 0), cache.read()
    if not native:
        assert {a.pop() for a in answers.values()} == {"fp32"}


@pytest.mark.parametrize(
    "precision,accum,stage,value",
    [("bf16", 4, 1, "fp32"), ("bf16", 4, 2, "fp32"), ("bf16", 4, 3, "fp32"),
     ("bf16", 1, 2, "bf16"), ("bf16", 4, 0, "bf16"), ("fp32", 4, 2, "fp32"),
     ("fp16", 4, 2, "fp16")],
)  # fmt: skip
def test_gradients_are_summed_in_fp32_under_bf16_where_a_step_accumulates(
    precision: str, accum: int, stage: int, value: str
) -> None:
    here = PrecisionChoice(precision, "given")
    train = {"precision": precision, "grad_accum": accum, "zero_stage": stage}
    if precision == "fp16":  # fp16 runs on a GPU only
        record = autos.resolve_all({**TRAIN, **train}, "cuda", 64, 256, None, None, lambda: here)
    else:
        record = resolve(None, here, **train)
    assert autos.values(record)["grad_accum_dtype"] == value


def test_the_summing_dtype_is_kept_and_a_run_from_before_it_keeps_its_own() -> None:
    train = {"grad_accum": 4, "zero_stage": 1}
    first = resolve(None, BF16_HERE, **train)
    assert autos.values(first)["grad_accum_dtype"] == "fp32"
    # a later start with another accumulation (resumed on more ranks) keeps the first's
    again = resolve(first, BF16_HERE, grad_accum=1, zero_stage=1)
    assert autos.values(again)["grad_accum_dtype"] == "fp32"
    assert "as the run's first start decided" in again.decisions["grad_accum_dtype"].reason
    # a record written before the key existed: the run goes on summing as it began (bf16)
    old = Record("cpu", {k: d for k, d in first.decisions.items() if k != "grad_accum_dtype"})
    kept = resolve(old, BF16_HERE, **train)
    assert autos.values(kept)["grad_accum_dtype"] == "bf16"
    assert autos.values(resolve(None, BF16_HERE, saved="bf16", **train))["grad_accum_dtype"] == (
        "bf16"
    )  # a run dir with a checkpoint and no record at all: as it began too
    # set in the config: taken, or refused in one line where DeepSpeed cannot
    given = resolve(None, BF16_HERE, grad_accum_dtype="bf16", **train)
    assert autos.values(given)["grad_accum_dtype"] == "bf16"
    with pytest.raises(autos.DecisionError, match=r"needs train\.zero_stage >= 1"):
        resolve(None, BF16_HERE, grad_accum_dtype="fp32", grad_accum=4, zero_stage=0)
    with pytest.raises(autos.DecisionError, match=r"needs train\.precision=bf16, not fp32"):
        resolve(None, FP32_HERE, grad_accum_dtype="bf16")


def test_a_config_that_sets_both_is_checked_before_any_process_starts() -> None:
    from trainer.config import TrainConfig

    bad = TrainConfig(precision="bf16", zero_stage=0, grad_accum=4, grad_accum_dtype="fp32")
    assert [k for k, _ in bad.problems()] == ["grad_accum_dtype"]
    assert not TrainConfig(precision="bf16", zero_stage=2, grad_accum_dtype="fp32").problems()
    assert not TrainConfig(precision="auto", zero_stage=0, grad_accum_dtype="fp32").problems()
