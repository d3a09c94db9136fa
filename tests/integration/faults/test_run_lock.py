"""One writer per run dir, with real launchers: a second `paperscale train` on a run dir in use
is refused at once (exit 2, one line naming the holder) and the first trains exactly as a lone
run; a holder killed with SIGKILL leaves no lock behind, and the next run resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import RUN_TOKEN, WORKERS, cli_env, paperscale, signal_run
from tests.integration.faults.conftest import CONFIG, STEPS, losses, overrides

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def start_train(run_dir: Path, over: list[str]) -> tuple[subprocess.Popen, str]:
    token = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.cli", "train", "--config", str(CONFIG), "--nproc", "2",
         "--run-dir", str(run_dir), *over],
        cwd=run_dir.parent, env={**cli_env(), RUN_TOKEN: token}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    return proc, token


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not (run_dir / "metrics.jsonl").is_file() or max(losses(run_dir), default=0) < step:
        assert proc.poll() is None, "the run ended before the step"
        assert time.monotonic() < deadline, f"step {step} not reached"
        time.sleep(0.2)


def test_a_second_writer_is_refused_and_the_first_is_unharmed(
    synthetic_data: Path, reference_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    first, token = start_train(run_dir, overrides(synthetic_data, STEPS))
    try:
        wait_for_step(run_dir, 1, first)
        started = time.monotonic()
        second = paperscale(
            "train", "--config", str(CONFIG), "--nproc", "2", "--run-dir", str(run_dir),
            *overrides(synthetic_data, STEPS, "train.seed=2"), cwd=tmp_path, timeout=120,
        )  # fmt: skip
        refused_in = time.monotonic() - started
        out, _ = first.communicate(timeout=300)
    finally:
        signal_run(first.pid, token, signal.SIGKILL)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert second.stderr.count("\n") == 1 and f"{run_dir} is in use by pid " in second.stderr
    assert refused_in < 30  # no process group was started for it
    assert first.returncode == 0, out[-3000:]
    got, want = losses(run_dir), losses(reference_run)
    assert [got[s] for s in sorted(got)] == [want[s] for s in sorted(want)]  # bitwise
    seeds = {json.loads(m.read_text())["config"]["train"]["seed"]
             for m in run_dir.glob("checkpoints/step_*/meta.json")}  # fmt: skip
    assert seeds == {1}


def test_a_killed_holder_leaves_no_lock_behind(synthetic_data: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    over = overrides(synthetic_data, STEPS, WORKERS)  # loader workers among the killed
    proc, token = start_train(run_dir, over)
    try:
        wait_for_step(run_dir, 3, proc)
    finally:
        signal_run(proc.pid, token, signal.SIGKILL)  # launcher, torchrun, ranks, workers
        proc.communicate(timeout=60)
    record = json.loads((run_dir / ".lock").read_text())
    assert not os.path.exists(f"/proc/{record['pid']}")  # its holder is gone, the file stays
    again = paperscale(
        "train", "--config", str(CONFIG), "--nproc", "2", "--run-dir", str(run_dir), *over,
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resumed from" in again.stdout
    assert (run_dir / ".lock").read_text() == ""  # released at the end: no record left
