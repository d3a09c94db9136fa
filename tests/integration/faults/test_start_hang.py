"""A rank that never answers the first collectives of the start-up: the ranks that wait for it
fail within train.dist_timeout_s with one line naming it and where it stopped, instead of
gloo's timeout, which names no rank (trainer/startup.py)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.integration.conftest import paperscale
from tests.integration.faults.conftest import CONFIG, fault_env, overrides
from trainer.startup import PHASES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TIMEOUT_S = 10


@pytest.mark.parametrize(
    "phase",
    ["process group", "build", "first step"],
    ids=["never-joins-the-group", "joins-then-stops", "stops-before-the-first-step"],
)
def test_a_rank_that_never_answers_in_the_start_up_is_named(
    synthetic_data: Path, tmp_path: Path, phase: str
) -> None:
    """Rank 1 stops before `phase`; rank 0 gets there and waits in its first collective."""
    run_dir = tmp_path / "run"
    env = fault_env(rank="1", hang_at_start=phase)
    args = overrides(
        synthetic_data, 4, f"train.dist_timeout_s={TIMEOUT_S}", "train.max_restarts=0",
        "train.stop_grace_s=5",  # torchrun's SIGKILL for the hung rank, 5 s after its SIGTERM
    )  # fmt: skip
    began = time.time()
    proc = paperscale(
        "train", "--config", str(CONFIG), "--nproc", "2", "--run-dir", str(run_dir), *args,
        cwd=tmp_path, env=env, timeout=180,
    )  # fmt: skip
    took = time.time() - began
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    injected = re.search(rf"fault injected: rank 1 hanging before '{phase}' at (\d+\.\d+)", out)
    assert injected, out[-3000:]
    # rank 0's collective raised (its line), or its watchdog fired first (the report's line)
    said = f"in its start-up at {phase!r} for rank 1 ("
    lines = [x for x in out.splitlines() if x.startswith("paperscale: ") and said in x]
    assert lines, out[-3000:]
    line = lines[0]
    assert line.startswith(
        ("paperscale: error: rank 0 (", "paperscale: watchdog: rank 0 ran past")
    ), line
    before = PHASES[PHASES.index(phase) - 1]
    assert re.search(rf"for rank 1 \(\S+, pid \d+\), still at '{before}' since \d+ s", line)
    print(f"\n{phase}: {line}\n  {took:.1f} s from the launch to the launcher's exit")
    # the start-up record of a rank ends with its start-up; a failed one stays for the next
    assert list((run_dir / "logs").glob("start-*-rank00001.txt")), "rank 1's record is gone"
