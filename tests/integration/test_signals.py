"""SIGUSR1 / SIGTERM to a 2-rank local run: finish the step, save, exit 75; resume continues."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL, WORKERS, cli_env, paperscale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_saves_and_exits_75_then_resumes(
    synthetic_data: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    run_dir = tmp_path / "run"
    args = [
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "2",
        "--run-dir", str(run_dir), f"data.dir={synthetic_data}", *TINY_MODEL, WORKERS,
        "train.log_every=1", "train.eval_every=0", "train.save_every=0",
        "logging.wandb=disabled", "logging.tensorboard=false",
    ]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.cli", *args, "train.max_steps=100000"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while len(logged_steps(run_dir)) < 3:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.5)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, out[-3000:]
    assert f"{sig.name} received" in out
    stopped = logged_steps(run_dir)[-1]
    tag = (run_dir / "checkpoints/latest").read_text().strip()
    assert tag == f"step_{stopped:08d}"
    assert json.loads((run_dir / "summary.json").read_text())["preempted"] is True

    done = paperscale(*args, f"train.max_steps={stopped + 2}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"at step {stopped}" in done.stdout
    steps = logged_steps(run_dir)
    assert steps == sorted(set(steps)) and steps[-1] == stopped + 2
