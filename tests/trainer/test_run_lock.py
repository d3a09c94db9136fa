"""One writer per run dir (trainer/run_lock.py): a live holder refuses a second writer and is
named; a dead one's lock is gone with it; the record guards where flock would not reach
another host; a later attempt of the same Slurm job takes over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.run_lock import (
    HOLDER_ENV,
    LOCK_NAME,
    STALE_S,
    Holder,
    RunLock,
    RunLocked,
    read_holder,
)

ROOT = Path(__file__).resolve().parents[2]
HOLD = (
    "import sys, time; sys.path.insert(0, {root!r}); from trainer.run_lock import RunLock; "
    "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)"
)


def holder_process(run: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(root=str(ROOT)), str(run)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def write_record(run: Path, holder: Holder, age_s: float) -> None:
    path = run / LOCK_NAME
    path.write_text(json.dumps(holder.__dict__) + "\n")
    old = time.time() - age_s
    os.utime(path, (old, old))


def test_a_live_holder_refuses_a_second_writer_and_its_death_frees_the_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    proc = holder_process(tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(RunLocked) as err:
            RunLock(tmp_path).acquire()
        assert time.monotonic() - started < 1.0  # at once, not after a wait
        message = str(err.value)
        assert "\n" not in message and f"pid {proc.pid} on " in message
        assert message.startswith(f"{tmp_path} is in use by ")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    lock = RunLock(tmp_path).acquire()  # no manual clean-up
    record = json.loads((tmp_path / LOCK_NAME).read_text())
    assert record["pid"] == os.getpid()
    lock.release()


def test_a_record_of_a_live_writer_elsewhere_is_refused_until_it_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What guards a file system where flock does not reach other hosts."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    other = Holder("other-node", 4242, "", "2026-01-01T00:00:00+0000")
    write_record(tmp_path, other, age_s=5)
    with pytest.raises(RunLocked, match="pid 4242 on other-node"):
        RunLock(tmp_path).acquire()
    write_record(tmp_path, other, age_s=STALE_S + 1)
    RunLock(tmp_path).acquire().release()


def test_an_earlier_attempt_of_the_same_job_and_a_dead_pid_are_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    write_record(tmp_path, Holder("node3", 99, "777", "t"), age_s=1)  # the previous attempt
    RunLock(tmp_path).acquire().release()
    write_record(tmp_path, Holder("node3", 99, "778", "t"), age_s=1)  # another job: live
    with pytest.raises(RunLocked, match="Slurm job 778"):
        RunLock(tmp_path).acquire()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    write_record(tmp_path, Holder(Holder.me().host, int(dead.stdout), "", "t"), age_s=1)
    RunLock(tmp_path).acquire().release()


def test_a_released_lock_leaves_no_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that takes the lock for a moment (the Slurm job's `check`) must not leave a
    fresh record that a writer on another host would honour until it is stale."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    RunLock(tmp_path).acquire().release()
    assert (tmp_path / LOCK_NAME).read_text() == ""
    assert read_holder(tmp_path / LOCK_NAME) is None


def test_an_inherited_claim_counts_only_while_the_lock_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HOLDER_ENV left in an environment (a process that held another run, or one whose lock
    is gone) must not let a writer skip the lock."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    lock = RunLock(tmp_path)
    monkeypatch.setenv(HOLDER_ENV, str(tmp_path / "other" / LOCK_NAME))
    assert not lock.held_for_me()  # another run dir's
    monkeypatch.setenv(HOLDER_ENV, str(lock.path))
    assert not lock.held_for_me()  # no lock file yet
    held = RunLock(tmp_path).acquire()
    assert lock.held_for_me()  # what a rank under the launcher sees
    held.release()
    assert not lock.held_for_me()  # the holder let go: a stale claim
