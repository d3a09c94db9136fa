"""Fault-injection settings and the checkpoint size estimate (no processes)."""

from __future__ import annotations

import errno
import time
from pathlib import Path

from trainer.checkpoint.disk import estimate_bytes, write_error
from trainer.faults import Faults


def test_faults_follow_the_attempt_and_the_rank() -> None:
    env = {
        "PAPERSCALE_FAULT_RANK": "1",
        "PAPERSCALE_FAULT_KILL_AT_STEP": "3,6,9",
        "PAPERSCALE_FAULT_KILL_IN_SAVE": "2:0,3:1:0",
        "PAPERSCALE_FAULT_NAN_FROM_STEP": "4",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    rank1, rank0 = Faults.from_env(1, env), Faults.from_env(0, env)
    assert (rank1.kill_at_step, rank1.nan_from_step, rank1.kill_in_save) == (6, 4, None)
    assert (rank0.kill_at_step, rank0.nan_from_step, rank0.kill_in_save) == (None, None, (3, 1))
    assert Faults.from_env(0, {}) == Faults()


def test_estimate_from_the_model_then_from_the_last_checkpoint(tmp_path: Path) -> None:
    assert estimate_bytes(tmp_path, 1000, "bf16") == int(1000 * 14 * 1.1) + 2**16
    assert estimate_bytes(tmp_path, 1000, "fp32") == int(1000 * 12 * 1.1) + 2**16
    tag = tmp_path / "step_00000002"
    tag.mkdir()
    (tag / "complete").write_text("2\n")
    (tag / "x.pt").write_bytes(b"0" * 5000)
    assert estimate_bytes(tmp_path, 1000, "bf16") == 5002


def test_write_error_names_a_full_disk(tmp_path: Path) -> None:
    full = write_error(tmp_path / "f.pt", OSError(errno.ENOSPC, "No space left on device"))
    assert "No space left on device" in full
    other = write_error(tmp_path / "f.pt", RuntimeError("boom\nmore"))
    assert other.endswith("f.pt: boom") or "No space left" in other


def test_a_slowed_run_sleeps_after_each_step_from_its_step() -> None:
    faults = Faults.from_env(0, {"PAPERSCALE_FAULT_SLOW_FROM_STEP": "3:0.05"})
    assert faults.slow_from == (3, 0.05)
    assert Faults.from_env(1, {"PAPERSCALE_FAULT_SLOW_FROM_STEP": "3:0.05"}).slow_from is None
    took = []
    for step in (2, 3, 4):
        start = time.perf_counter()
        faults.step_ended(step)
        took.append(time.perf_counter() - start)
    assert min(took[1:]) >= 0.05  # steps 3 and 4 slept
    assert took[0] < 0.05


def test_a_slowed_run_is_slowed_up_to_its_last_step() -> None:
    faults = Faults.from_env(0, {"PAPERSCALE_FAULT_SLOW_FROM_STEP": "3:0.05:5"})
    assert (faults.slow_from, faults.slow_until) == ((3, 0.05), 5)
    took = {}
    for step in (2, 3, 4, 5, 6):
        start = time.perf_counter()
        faults.step_ended(step)
        took[step] = time.perf_counter() - start
    assert took[3] >= 0.05 and took[4] >= 0.05
    assert max(took[2], took[5], took[6]) < 0.05
