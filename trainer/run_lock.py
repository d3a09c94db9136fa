"""One writer per run directory: RUN/.lock.

The process that starts a run - `paperscale train` (the launcher), a Slurm job's node task on
the first node, or rank 0 when torchrun is started by hand - takes an exclusive `flock` on
RUN/.lock and keeps it while the run lives; the kernel drops it when the holder dies, however
it dies, so a crash never leaves a lock behind. The holder writes who it is (host, pid, Slurm
job, time) into the file and refreshes the file's time every HEARTBEAT_S seconds. A second
writer is refused at once, naming the holder (`RunLocked`, exit 2).

Shared file systems: on a local disk, NFS v4 (Linux maps flock onto NFS byte-range locks) and
Lustre or GPFS mounted with lock support, the flock works across hosts. Where it is local to
each host (NFS v3 without lockd, Lustre mounted `noflock`/`localflock`), the record guards:
a record of another host whose heartbeat is younger than STALE_S is taken as a live holder and
refused too, so two writers on two hosts can collide only when both start within the same
instant. A record of the same Slurm job (a requeued or restarted attempt: Slurm starts it only
after the previous attempt's processes ended) or of a dead process on this host is taken over
at once; any other record is taken over once its heartbeat is STALE_S old.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

LOCK_NAME = ".lock"
HOLDER_ENV = "PAPERSCALE_RUN_LOCK"  # set for the holder's children: the lock is taken
HEARTBEAT_S = 30.0
STALE_S = 120.0


class RunLocked(Exception):
    """Another writer holds the run dir; `str()` is one line naming it."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    job_id: str
    started: str

    @classmethod
    def me(cls) -> Holder:
        return cls(
            socket.gethostname(),
            os.getpid(),
            os.environ.get("SLURM_JOB_ID", ""),
            time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )

    def describe(self) -> str:
        job = f", Slurm job {self.job_id}" if self.job_id else ""
        return f"pid {self.pid} on {self.host}{job}, since {self.started}"


def read_holder(path: Path) -> Holder | None:
    try:
        data: Any = json.loads(path.read_text())
        fields = (str(data["host"]), int(data["pid"]), str(data["job_id"]), str(data["started"]))
        return Holder(*fields)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def record_is_live(record: Holder, age_s: float, me: Holder) -> bool:
    """Whether a record found under a lock this process got means another live writer (one
    that the flock could not see: another host on a file system without shared flocks)."""
    if me.job_id and record.job_id == me.job_id:
        return False  # an earlier attempt of this job
    if record.host == me.host:
        return record.pid != me.pid and _alive(record.pid) and age_s < STALE_S
    return age_s < STALE_S


class RunLock:
    """The lock of one run dir, held from `acquire` until `release` or the process's end."""

    def __init__(self, run_root: Path) -> None:
        self.path = Path(run_root) / LOCK_NAME
        self.file: TextIO | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 -- kept open while the lock is held
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise RunLocked(self._refusal(read_holder(self.path))) from None
        record = read_holder(self.path)
        age = 0.0
        with contextlib.suppress(OSError):
            age = time.time() - self.path.stat().st_mtime
        me = Holder.me()
        if record is not None and record_is_live(record, age, me):
            f.close()
            raise RunLocked(self._refusal(record))
        f.seek(0)
        f.truncate()
        f.write(json.dumps(me.__dict__) + "\n")
        f.flush()
        os.fsync(f.fileno())
        self.file = f
        self._beat = threading.Thread(target=self._heartbeat, daemon=True, name="run-lock")
        self._beat.start()
        return self

    def held_for_me(self) -> bool:
        """Whether a parent holds this lock for this process: HOLDER_ENV names this lock and
        the lock is held (a fresh descriptor cannot take it). A stale HOLDER_ENV -- inherited
        from a process that held another run dir, or whose lock is gone -- is not a claim."""
        if os.environ.get(HOLDER_ENV) != str(self.path) or not self.path.is_file():
            return False
        with open(self.path, "a+") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False

    def _refusal(self, holder: Holder | None) -> str:
        who = holder.describe() if holder else "another process"
        return (
            f"{self.path.parent} is in use by {who}: one run dir has one writer (stop that "
            "run, or use another --run-dir)"
        )

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.truncate(0)  # released: no record left for other hosts to honour
                self.file.flush()
                fcntl.flock(self.file.fileno(), fcntl.LOCK_UN)
            self.file.close()
            self.file = None

    @property
    def fd(self) -> int:
        """The locked file's descriptor (children that inherit it keep the lock alive)."""
        assert self.file is not None
        return self.file.fileno()
