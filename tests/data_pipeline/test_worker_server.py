"""The loader workers' fork server: forked from a rank that runs one thread (torch already
loaded), started as a new interpreter otherwise; either way workers fork from it and hand out
batches, and the forked server holds nothing of the rank's (no lock, stop signals blocked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_pipeline.worker_server import SERVER_ENV

ROOT = Path(__file__).resolve().parents[2]

# In a process of its own: pytest's workers run threads, and a process has one fork server.
SCRIPT = """
import fcntl, json, os, sys, threading, time
import torch
from data_pipeline.worker_server import start_early, worker_context
from multiprocessing import forkserver

lock_file = open(sys.argv[1], "w")
fcntl.flock(lock_file, fcntl.LOCK_EX)
if sys.argv[2] == "thread":  # another thread runs, as it would after the process group starts
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
how = start_early(1)
again = start_early(1)
pid = forkserver._forkserver._forkserver_pid
loader = torch.utils.data.DataLoader(
    list(range(6)), batch_size=2, num_workers=1, multiprocessing_context=worker_context()
)
batches = [b.tolist() for b in loader]
time.sleep(0.5)  # the server has imported its preload by now
# read once the server has served a worker: a started server may still show this process's
# command line right after its vfork returns, until its exec has switched memory maps
cmdline = open(f"/proc/{pid}/cmdline").read().replace("\\0", " ")
ppid = int(open(f"/proc/{pid}/stat").read().split(")")[1].split()[1])
blocked = int(
    [x for x in open(f"/proc/{pid}/status") if x.startswith("SigBlk")][0].split()[1], 16
)
lock_file.close()  # the rank lets go of its lock: nobody else may hold it now
probe = open(sys.argv[1])
try:
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock_free = True
except OSError:
    lock_free = False
print(json.dumps({"how": how, "again": again, "forked": ppid == os.getpid(),
                  "fresh_python": "forkserver " + "import main" in cmdline,  # its -c line
                  "batches": batches, "blocked": blocked, "lock_free": lock_free}))
"""


@pytest.mark.parametrize("threads", ["one", "thread", "asked"])
def test_workers_fork_from_a_server_that_holds_nothing_of_the_rank(
    tmp_path: Path, threads: str
) -> None:
    """`asked`: one thread, but PAPERSCALE_WORKER_SERVER=started asks for a new interpreter."""
    env = {**os.environ, SERVER_ENV: "started" if threads == "asked" else ""}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "run.lock"), threads],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    if threads == "one":  # forked from the rank itself: no second import of torch
        assert (got["how"], got["forked"], got["fresh_python"]) == ("forked", True, False)
    else:  # another thread: multiprocessing's own server, a new interpreter
        assert (got["how"], got["fresh_python"]) == ("started", True)
    assert got["again"] == "started"  # one server per process: the running one is kept
    assert got["batches"] == [[0, 1], [2, 3], [4, 5]]
    for sig in (10, 15):  # SIGUSR1, SIGTERM: blocked in the server, as worker_start blocks them
        assert got["blocked"] & (1 << (sig - 1)), hex(got["blocked"])
    assert got["lock_free"], "the fork server still holds the rank's lock"


def test_no_workers_no_server() -> None:
    code = (
        "from data_pipeline.worker_server import start_early\n"
        "from multiprocessing import forkserver\n"
        "print(start_early(0), forkserver._forkserver._forkserver_pid)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.split() == ["none", "None"], proc.stderr
