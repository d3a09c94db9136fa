"""A rank that never answers the first collectives of the start-up: the ranks that wait for it
fail within train.dist_timeout_s with one line naming it and where it stopped, instead of
gloo's timeout, which names no rank (trainer/startup.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import RUN_TOKEN, signal_run
from tests.integration.faults.conftest import CONFIG, fault_env, overrides
from trainer.startup import PHASES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TIMEOUT_S = 10
# torchrun tears the group down after a failed rank: ranks started as new interpreters, or
# forked from its agent (torch.multiprocessing's words)
TORCHRUN_STOPS = re.compile(r"closing signal SIGTERM|Terminating process \d+ via signal SIGTERM")


# (a rank that stops before its first step: its peer's watchdog fires in the first step, and
# the report names the rank the same way: tests/trainer/test_attempts.py)
@pytest.mark.parametrize(
    "phase", ["process group", "build"], ids=["never-joins-the-group", "joins-then-stops"]
)
def test_a_rank_that_never_answers_in_the_start_up_is_named(
    synthetic_data: Path, tmp_path: Path, phase: str
) -> None:
    """Rank 1 stops before `phase`; rank 0 gets there and waits in its first collective: the
    store's rendezvous of the world's group, or DeepSpeed's first group of its own (which
    waited torch's default 30 min before every group took train.dist_timeout_s). Once rank 0
    has failed and torchrun tears the group down, the test ends the processes itself: torchrun
    would wait 30 s more for the stopped rank to answer its TERM."""
    run_dir, log = tmp_path / "run", tmp_path / "out.log"
    args = overrides(synthetic_data, 4, f"train.dist_timeout_s={TIMEOUT_S}", "train.max_restarts=0")
    token = uuid.uuid4().hex
    env = {**fault_env(rank="1", hang_at_start=phase), "PYTHONFAULTHANDLER": "1", RUN_TOKEN: token}
    cmd = [sys.executable, "-m", "launch.cli", "train", "--config", str(CONFIG), "--nproc", "2",
           "--run-dir", str(run_dir), *args]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not TORCHRUN_STOPS.search(log.read_text()) and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        signal_run(proc.pid, token, 9)
        proc.wait(timeout=60)
    out_text = log.read_text()
    injected = re.search(rf"fault injected: rank 1 hanging before '{phase}' at \d+\.\d+", out_text)
    assert injected, out_text[-3000:]
    lines = [x for x in out_text.splitlines() if x.startswith("paperscale: error: rank 0 (")]
    assert lines, out_text[-3000:]
    line = lines[0]
    said = f"waited train.dist_timeout_s={TIMEOUT_S} s in its start-up at {phase!r} for rank 1 ("
    assert said in line, line
    before = PHASES[PHASES.index(phase) - 1]
    assert re.search(rf"for rank 1 \(\S+, pid \d+\), still at '{before}' since \d+ s", line)
    stops = TORCHRUN_STOPS.search(out_text)
    assert stops and out_text.index(line) < stops.start()  # rank 0 said it, then failed
    print(f"\n{phase}: {line}")
    # the start-up record of a rank ends with its start-up; a failed one's stays in RUN/logs
    assert list((run_dir / "logs").glob("start-*-rank00001.txt")), "rank 1's record is gone"
