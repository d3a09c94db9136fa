"""SIGKILL of one rank at 3 different steps of a 2-rank run under torchrun --max-restarts:
every kill costs one restart, and the per-step losses equal an uninterrupted run's exactly
(no sample lost or repeated, RNG and optimizer state restored)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.faults.conftest import (
    STEPS,
    fault_env,
    losses,
    overrides,
    resumed_steps,
    torchrun_with_restarts,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

KILL_AT = [3, 6, 9]  # rank 1 dies right after these steps, before logging or saving them


def test_kills_are_survived_with_identical_losses(
    synthetic_data: Path, reference_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "killed"
    env = fault_env(rank="1", kill_at_step=",".join(map(str, KILL_AT)))
    over = overrides(synthetic_data, STEPS, "train.save_every=2")
    proc = torchrun_with_restarts(run_dir, over, len(KILL_AT), env, timeout=360)
    out = proc.stdout + proc.stderr
    (tmp_path / "killed.log").write_text(out)
    assert proc.returncode == 0, out[-4000:]
    assert out.count("fault injected: rank 1 SIGKILL after step") == len(KILL_AT)
    # saves every 2 steps: a kill after step k resumes from the last even step before it
    assert resumed_steps(out) == [k - 1 if k % 2 else k - 2 for k in KILL_AT]
    got, want = losses(run_dir), losses(reference_run)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == [want[s] for s in sorted(want)]  # bitwise
