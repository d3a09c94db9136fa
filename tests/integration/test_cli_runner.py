"""The suite's runner for the CLI ends every process a command started, also those that left
its process group (torchrun puts each rank in a session of its own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from data_pipeline.worker_signals import process_alive
from tests.integration.conftest import RUN_TOKEN, signal_run


def test_signal_run_reaches_a_process_in_another_session() -> None:
    token = uuid.uuid4().hex
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    # in a session of its own, as torchrun starts a rank; and an unrelated one without the token
    ours = subprocess.Popen(sleeper, env={**os.environ, RUN_TOKEN: token}, start_new_session=True)
    other = subprocess.Popen(sleeper, start_new_session=True)
    try:
        # Popen returns as the child execs; for a moment after, /proc may still show the
        # parent's environment (vfork: the exec has not switched the child's memory yet), in
        # which signal_run would not find the token. Wait until the sleeper's own shows.
        marker = f"{RUN_TOKEN}={token}".encode()
        environ = Path(f"/proc/{ours.pid}/environ")
        deadline = time.monotonic() + 30
        while marker not in environ.read_bytes().split(b"\0") and time.monotonic() < deadline:
            time.sleep(0.05)
        signal_run(os.getpgid(other.pid) + 10**7, token, signal.SIGKILL)  # a group that is none
        assert ours.wait(timeout=30) == -signal.SIGKILL
        time.sleep(0.2)
        assert process_alive(other.pid)
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait(timeout=30)
