"""The step-time calibration: `paperscale calibrate` on a small model writes a calibration file
that `paperscale plan --calibration FILE` reads, and the plan's step time for the config's own
batch is the calibration's model of it, figure for figure; with the config's prepared data it
also times the trainer's validation pass and decodes, which the plan prices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import SMOKE_MODEL
from launch.cost_model.speed import CALIBRATION_FORMAT, load_calibration
from tests.integration.conftest import synthetic_data  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[2]
# a small model and batch (bench/plan_calibration.py's smoke size), for the plan to match; the
# synthetic data's vocabulary (tests/integration/conftest.py)
SMOKE = [*SMOKE_MODEL, "data.max_tokens=256", "data.vocab_size=96", "train.bleu_samples=8"]


Smoke = tuple[Path, dict, str, list[str]]


@pytest.fixture(scope="module")
def smoke(
    tmp_path_factory: pytest.TempPathFactory,
    synthetic_data: Path,  # noqa: F811
) -> Smoke:
    """(calibration path, its contents, the command's output, its overrides) of one small
    calibration, with prepared data."""
    cal = tmp_path_factory.mktemp("calibration") / "cal.json"
    command = [sys.executable, "-m", "launch.cli", "calibrate", "--config", "configs/tiny.yaml"]
    over = [*SMOKE, f"data.dir={synthetic_data}"]
    small = ["--tokens", "64,256", "--steps", "2", "--seq-len", "16", *over]
    proc = subprocess.run(
        [*command, "--out", str(cal), *small],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return cal, json.loads(cal.read_text()), proc.stdout, over


def test_calibrate_writes_a_calibration(smoke: Smoke) -> None:
    path, cal, out, _ = smoke
    assert "the model says" in out and f"calibration      {path}" in out
    assert cal["format"] == CALIBRATION_FORMAT and cal["device"] == "cpu"
    assert cal["precision"] in ("bf16", "fp32") and cal["threads"] == 1 and cal["clock"] == "cpu"
    assert cal["flops_per_s"] > 0 and cal["overhead_s"] >= 0 and cal["overhead_micro_s"] >= 0
    assert cal["model"] == {"d_model": 32, "d_ff": 64, "vocab_size": 96}
    assert [(p["micro_tokens"], p["grad_accum"]) for p in cal["points"]] == [
        (64, 1),
        (256, 1),
        (64, 2),
    ]
    assert all(p["step_s"] > 0 for p in cal["points"])
    check = cal["check"]
    assert (check["micro_tokens"], check["grad_accum"]) == (256, 2)  # tiny's accumulation
    assert check["step_s"] > 0 and check["error"] == pytest.approx(
        check["predicted_s"] / check["step_s"] - 1
    )
    assert cal["peak_flops"] > 0 and cal["mfu"] == pytest.approx(
        cal["flops_per_s"] / cal["peak_flops"]
    )
    loaded = load_calibration(path)
    assert loaded.flops_per_s == cal["flops_per_s"] and loaded.gpu_key is None
    # the start-up and, with prepared data, the validation pass and two decodes of 8 and 4
    assert cal["startup"]["engine_s"] > 0 and cal["startup"]["first_step_extra_s"] >= 0
    events = cal["events"]
    assert events["valid_samples"] == 64 and events["eval_s"] > 0 and events["bleu_beam"] == 1
    assert (events["decode"]["small"], events["decode"]["large"]) == (4, 8)
    assert "validation pass" in out and "decoding 8 sentences" in out
    assert loaded.events is not None and loaded.events.decodes[1][0] == 8
    assert loaded.startup_s == pytest.approx(sum(cal["startup"].values()))


def test_calibrate_times_a_world_of_the_runs_ranks(smoke: Smoke, tmp_path: Path) -> None:
    """`--ranks 2`: the calibration runs as 2 local ranks of one world (torchrun), timed on rank
    0 as a run's ranks step (the gradients' synchronisation in), each rank decoding its share
    of the sentences; a plan of 2 ranks per node says when its calibration timed another
    number of ranks."""
    path, _, _, over = smoke
    cal = tmp_path / "cal2.json"
    small = ["--tokens", "64,256", "--steps", "2", "--seq-len", "16", "--ranks", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "calibrate", "--config", "configs/tiny.yaml",
         "--out", str(cal), *small, *over],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("2 ranks in one world, timed on rank 0") == 1  # rank 0 alone says
    raw = json.loads(cal.read_text())
    assert raw["ranks"] == 2 and raw["clock"] == "wall" and raw["events"]["world"] == 2
    loaded = load_calibration(cal)
    assert loaded.ranks == 2 and loaded.events is not None and loaded.events.world == 2
    args = ["--gpus-per-node", "2", "--seq-len", "16", *over]
    alone = next(x for x in _plan(*args, "--calibration", str(path)).stdout.splitlines()
                 if x.startswith("speed"))  # fmt: skip
    assert "timed as 1 rank(s) on the machine, this plan puts 2 on it" in alone
    together = json.loads(_plan(*args, "--calibration", str(cal), "--json").stdout)
    assert "timed as" not in together["speed_line"]
    # its validation pass was each rank's half already: the plan's 2 ranks take it as it is
    assert together["run_time"]["eval_s"] == pytest.approx(raw["events"]["eval_s"])


def test_the_step_model_fit_recovers_its_terms_and_keeps_them_non_negative() -> None:
    from launch.cost_model.calibrate import fit_step_model

    def exact(t: int, a: int) -> float:
        return 0.030 + a * 0.010 + a * t * 2e-4

    points = [(t, a, exact(t, a)) for t, a in ((256, 1), (512, 1), (1024, 1), (256, 2))]
    assert fit_step_model(points) == pytest.approx((0.030, 0.010, 2e-4))
    # a second micro-batch that costs less than nothing is noise: that term is dropped
    noisy = [(256, 1, 0.1), (1024, 1, 0.4), (256, 2, 0.18)]
    per_step, per_micro, per_token = fit_step_model(noisy)
    assert per_step >= 0 and per_micro >= 0 and per_token > 0
    assert per_step + 2 * per_micro + 512 * per_token == pytest.approx(0.18, rel=0.2)


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", "plan", "--config", "configs/tiny.yaml", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_plan_predicts_with_the_calibration(smoke: Smoke) -> None:
    """Two CPU ranks of the small model: the plan's step for the config's own batch (256 x 2
    per rank) is the one the calibration timed at that batch (its check), another batch's is
    the model's prediction, and the speed line says it was measured."""
    path, cal, _, over = smoke
    args = ["--gpus-per-node", "2", "--calibration", str(path), "--seq-len", "16", *over]
    proc = _plan(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["speed_measured"] is True and plan["precision"] == cal["precision"]
    assert plan["configured"]["timed"] is True
    assert plan["configured"]["step_s"] == pytest.approx(cal["check"]["step_s"], rel=1e-9)
    other = json.loads(_plan(*args, "train.grad_accum=3", "--json").stdout)["configured"]
    assert other["timed"] is False and other["step_s"] > 0  # untimed: the model's
    # a calibration of another model's shapes times nothing of this one
    wide = json.loads(_plan(*args, "model.d_model=64", "model.d_ff=128", "--json").stdout)
    assert wide["configured"]["timed"] is False
    assert plan["overhead_s"] == pytest.approx(
        cal["overhead_s"] + plan["grad_accum"] * cal["overhead_micro_s"]
    )
    table = _plan(*args).stdout
    assert f"speed            {cal['device_name']}: measured here ({path})" in table
    assert "as configured    256 x 2 x 2 ranks = 1,024 tokens per side" in table
    # beside the steps: the timed start-up, the validation pass shared by the 2 ranks, and
    # the decode of each rank's 4 of the 8 BLEU sentences (the smaller decode's own figure)
    rt, events = plan["run_time"], cal["events"]
    assert rt["priced"] and rt["eval_s"] == pytest.approx(events["eval_s"] / 2)
    assert rt["startup_s"] == pytest.approx(sum(cal["startup"].values()))
    (small, t_small), (large, t_large) = [(events["decode"][k], events["decode"][f"{k}_s"])
                                          for k in ("small", "large")]  # fmt: skip
    per = max(t_large - t_small, 0) / (large - small)
    assert rt["bleu_s"] == pytest.approx(max(t_small - per * small, 0) + per * 4)
    assert "beyond steps     start-up" in table and "(per rank, from the calibration)" in table


def test_a_calibration_without_timed_evaluations_prices_none(smoke: Smoke, tmp_path: Path) -> None:
    """A calibration taken without prepared data (its `events` null) prices no evaluation, and
    the plan says why."""
    _, cal, _, over = smoke
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({**cal, "events": None}))
    args = ["--gpus-per-node", "2", "--calibration", str(bare), "--seq-len", "16", *over]
    plan = json.loads(_plan(*args, "--json").stdout)
    assert not plan["run_time"]["priced"] and plan["run_time"]["eval_s"] == 0
    assert plan["run_time"]["why"] == "the calibration timed none (no prepared data.dir)"
    assert "evaluations not priced (the calibration timed none" in _plan(*args).stdout


def test_a_gpu_the_calibration_did_not_measure_is_assumed(smoke: Smoke) -> None:
    path, cal, _, _ = smoke
    proc = _plan("--gpu", "a100", "--calibration", str(path))
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("speed"))
    assert "A100: not measured here; planned from H200's measured MFU 0.235 (eager;" in line
    assert "at its own peak 312 TFLOP/s, by the ratio of peaks (989 / 312)" in line
    assert f"the calibration {path} is for {cal['device_name']}" in line
    # a GPU model the `gpu` bench measured: its end-to-end MFU, and why the calibration is not used
    proc = _plan("--gpu", "h200", "--calibration", str(path))
    line = next(x for x in proc.stdout.splitlines() if x.startswith("speed"))
    assert "H200: MFU 0.235 of its 989 TFLOP/s peak measured end to end (eager;" in line
    assert f"the calibration {path} is for {cal['device_name']}" in line
    explicit = _plan("--calibration", str(path), "train.precision=fp16", "--json")
    assert json.loads(explicit.stdout)["speed_measured"] is False  # it measured another precision


@pytest.mark.parametrize("content", ["{}", "not json", '{"format": 1, "device": "tpu"}'])
def test_a_bad_calibration_is_one_line(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "cal.json"
    bad.write_text(content)
    proc = _plan("--calibration", str(bad))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--calibration" in proc.stderr


def test_a_gpu_calibration_counts_for_that_gpu_only(tmp_path: Path) -> None:
    """A calibration taken on an H200 (the file the bench writes there) sets the rate, the
    overheads and the memory of `--gpu h200`; an A100 plan stays assumed."""
    cal = {
        "format": CALIBRATION_FORMAT, "device": "cuda", "device_name": "NVIDIA H200",
        "gpu_key": "H200", "precision": "bf16", "threads": 1, "flops_per_s": 4.0e14,
        "overhead_s": 0.008, "overhead_micro_s": 0.002, "peak_flops": 989e12,
        "memory_gib": 139.8, "model": {"d_model": 1024, "d_ff": 4096, "vocab_size": 37000},
    }  # fmt: skip
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(cal))
    big = ["--config", "configs/big.yaml", "--calibration", str(path), "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "plan", "--gpu", "h200", *big],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    plan = json.loads(proc.stdout)
    assert plan["speed_measured"] is True and plan["gpu_mem_gib"] == 139.8
    assert plan["compute_s"] == pytest.approx(plan["flops_per_step"] / (8 * 4.0e14))
    # a calibration is one rank's step: the 8 ranks' gradient sync comes on top
    overheads = 0.008 + 0.002 * plan["grad_accum"] + plan["comm_s"]
    assert plan["comm_s"] > 0 and plan["step_s"] == pytest.approx(plan["compute_s"] + overheads)
    assert plan["speed_line"].startswith(f"NVIDIA H200: measured here ({path}): 400.0 TFLOP/s")
    other = subprocess.run(
        [sys.executable, "-m", "launch.cli", "plan", "--gpu", "a100", *big],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(other.stdout)["speed_measured"] is False
