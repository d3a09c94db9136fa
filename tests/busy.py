"""Load for the tests that must hold on a busy machine: processes spinning on the cores."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def busy_processes(count: int = 4) -> Iterator[list[int]]:
    """`count` Python processes spinning until the block ends (each ended by its pid)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
