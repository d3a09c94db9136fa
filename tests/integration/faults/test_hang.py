"""A rank that hangs or dies between two collectives: every rank exits non-zero within
train.dist_timeout_s -- never an endless hang.

The two ranks are started as plain processes with RANK/WORLD_SIZE/MASTER_* set (as srun starts
them), with no torchrun agent that would kill the survivors: each must leave by itself, through
the process group's timeout (gloo) or the trainer's watchdog.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.faults.conftest import CONFIG, fault_env, overrides
from trainer.dist import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.serial]

TIMEOUT_S = 15
SLACK_S = 10  # process exit, traceback printing and a loaded machine


@pytest.mark.parametrize("fault", ["hang_at_step", "kill_at_step"])
def test_every_rank_exits_within_the_timeout(
    synthetic_data: Path, tmp_path: Path, fault: str
) -> None:
    run_dir = tmp_path / "run"
    args = overrides(synthetic_data, 1000, f"train.dist_timeout_s={TIMEOUT_S}")
    port = str(free_port())
    procs: list[subprocess.Popen] = []
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    try:
        for rank in range(2):
            env = fault_env(rank="1", **{fault: "3"})
            env.update(
                {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                 "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            )  # fmt: skip
            cmd = [sys.executable, "-m", "launch.cli", "train", "--config", str(CONFIG),
                   "--run-dir", str(run_dir), *args]  # fmt: skip
            with logs[rank].open("w") as log:
                proc = subprocess.Popen(
                    cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
                )
            procs.append(proc)
        exited: dict[int, float] = {}
        deadline = time.monotonic() + 240
        while len(exited) < 2 and time.monotonic() < deadline:
            for rank, proc in enumerate(procs):
                if rank not in exited and proc.poll() is not None:
                    exited[rank] = time.time()
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = [log.read_text() for log in logs]
    assert len(exited) == 2, text[0][-2000:] + text[1][-2000:]
    match = re.search(r"fault injected: rank 1 .* at (\d+\.\d+)", text[1])
    assert match, text[1][-3000:]
    injected = float(match.group(1))
    waited = {rank: t - injected for rank, t in exited.items()}
    print(f"\n{fault}: seconds from the fault to each rank's exit: {waited}")
    for rank, proc in enumerate(procs):
        if fault == "kill_at_step" and rank == 1:
            assert proc.returncode == -9
        else:
            assert proc.returncode not in (0, None), text[rank][-3000:]
    assert max(waited.values()) <= TIMEOUT_S + SLACK_S, waited
