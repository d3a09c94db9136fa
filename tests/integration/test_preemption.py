"""SIGTERM to every process of a run (what Slurm's preemption and `scancel` do): the ranks stop
at a step boundary, save and exit 75 within train.stop_grace_s, and the resumed run's per-step
losses equal an uninterrupted run's bitwise; a step that cannot finish in time is abandoned
and the last finished one saved."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL, WORKERS, cli_env, paperscale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.serial]
STEPS = 10
GRACE_S = 30.0  # Slurm's default KillWait


def args(run_dir: Path, data: Path, *extra: str) -> list[str]:
    return [
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "2",
        "--run-dir", str(run_dir), f"data.dir={data}", *TINY_MODEL, WORKERS,
        "train.grad_accum=2", "train.zero_stage=2", "train.precision=fp32",
        "train.log_every=1", "train.eval_every=0", "train.save_every=0",
        "train.bleu_samples=4", "train.bleu_beam=1", "logging.wandb=disabled",
        "logging.tensorboard=false", f"train.max_steps={STEPS}", *extra,
    ]  # fmt: skip


def losses(run_dir: Path) -> dict[int, float]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in records if r.get("loss") is not None}


@pytest.fixture(scope="module")
def straight(synthetic_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    proc = paperscale(*args(run_dir, synthetic_data), cwd=run_dir.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return losses(run_dir)


def test_term_to_every_process_saves_exits_75_and_resumes_exactly(
    synthetic_data: Path, tmp_path: Path, straight: dict[int, float]
) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.cli", *args(run_dir, synthetic_data)],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,  # its own process group: ours is not signalled
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while len(losses(run_dir)) < 3:
            assert proc.poll() is None, proc.stdout.read()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        # parent, torchrun, both ranks and their loader workers: all get TERM, as from Slurm
        os.killpg(proc.pid, signal.SIGTERM)
        sent = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 75, out[-3000:]
    assert seconds < GRACE_S, f"{seconds:.1f} s from TERM to exit"
    print(f"TERM to exit 75: {seconds:.1f} s")
    stopped = int(re.search(r"stopped at step (\d+) after a signal", out)[1])  # type: ignore[index]
    assert 3 <= stopped < STEPS
    assert (run_dir / "checkpoints/latest").read_text().strip() == f"step_{stopped:08d}"
    assert "Traceback" not in out, out[-3000:]

    resumed = paperscale(*args(run_dir, synthetic_data), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"at step {stopped}" in resumed.stdout
    got = losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == [straight[s] for s in sorted(straight)]  # bitwise


def test_a_step_that_cannot_finish_in_time_is_abandoned(
    synthetic_data: Path, tmp_path: Path, straight: dict[int, float]
) -> None:
    """TERM after the first micro-batch of step 5 with a grace period shorter than a save needs:
    the step is dropped before its optimizer update and step 4 is what gets saved."""
    run_dir = tmp_path / "run"
    command = args(run_dir, synthetic_data, "train.stop_grace_s=2")
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", *command],
        cwd=tmp_path, env={**cli_env(), "PAPERSCALE_FAULT_TERM_AT": "5:0"},
        capture_output=True, text=True, timeout=300, start_new_session=True,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 75, out[-3000:]
    assert "step 5 abandoned after 1 micro-batches" in out
    assert "stopped at step 4 after a signal" in out
    assert sorted(losses(run_dir)) == [1, 2, 3, 4]
    assert (run_dir / "checkpoints/latest").read_text().strip() == "step_00000004"

    resumed = paperscale(*args(run_dir, synthetic_data), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    got = losses(run_dir)
    assert [got[s] for s in sorted(got)] == [straight[s] for s in sorted(straight)]  # bitwise
