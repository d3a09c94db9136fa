"""The c10d rendezvous of a Slurm job's torchrun: its port, and what a failed start leaves.

The batch shell runs on the first node of the allocation, which hosts the rendezvous store.
For every try it picks the port there: one that nothing listens on at that moment, so that no
other job on a shared node, no earlier attempt of the same job (a requeued job keeps its id,
and the previous attempt's store may still hold its port while it shuts down) and no other
program can make the job fail. A port taken in the instant between that choice and torchrun's
bind (or any other failure before a rank starts) fails that try only: each node task whose
torchrun ended before starting a rank records why (`record_startup_failure`), and the batch
shell tries again on a new port, `TRIES` times in all, saying why in one line each time.

A node that never joins is another matter: each node task notes its arrival before it starts
torchrun (`arrive`), the rendezvous waits train.dist_timeout_s for all of them (torchrun's
join_timeout), and when it fails the batch shell names the nodes that never arrived
(`absent_nodes`) and tries no more ports.
"""

from __future__ import annotations

import os
import random
import re
import socket
import time
from collections.abc import Iterable
from pathlib import Path

from trainer.run_dir import RunDir

TRIES = 3  # srun steps per job attempt before a failing start ends the job
# Fault tests: the task of this node id (SLURM_NODEID, not 0) never starts torchrun, as a node
# that never joins; it waits until a signal (srun ending the step) ends it.
ABSENT_FAULT = "PAPERSCALE_FAULT_ABSENT_NODE"

# The last line of a Python traceback: `pkg.mod.SomeError: message`.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception)): (.+)$")


LOWEST_PORT = 10000  # below: well-known and registered services, more often firewalled


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections and bind(0): Linux's
    ip_local_port_range (32768-60999 unless configured)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def bindable(port: int) -> bool:
    """Whether a TCP socket can bind `port` on every address now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port(rng: random.Random | None = None) -> int:
    """A TCP port that nothing on this host listens on now, on any address (the rendezvous
    store listens on all of them), taken below the kernel's ephemeral range: a port of that
    range may be given to any outgoing connection of the node in the instant between this
    choice and torchrun's bind (seen on a busy node: EADDRINUSE on the first try), while one
    below it is taken only by a program that binds it by number. bind(0)'s port where the
    ephemeral range leaves no room below it."""
    rng = rng or random.Random()
    low, _ = ephemeral_range()
    if low - LOWEST_PORT >= 1000:
        for _ in range(64):
            port = rng.randrange(LOWEST_PORT, low)
            if bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def port_for_try(attempt_try: int, fixed_port: int = 0) -> int:
    """The rendezvous port of try `attempt_try` (1-based) of a job attempt: the profile's
    `rendezvous_port` for the first try when one is set (a firewall's opening), else, and for
    every later try, a free one."""
    if fixed_port and attempt_try == 1:
        return fixed_port
    return free_port()


def first_error(lines: Iterable[str]) -> str | None:
    """The first exception line of a traceback text (the root cause of a chained one),
    without its module path: `DistNetworkError: ... EADDRINUSE ...`."""
    for line in lines:
        match = _EXCEPTION_LINE.match(line.strip())
        if match:
            return f"{match[1]}: {match[2].strip()}"
    return None


def record_startup_failure(
    run: RunDir, job_id: str, restart: str, attempt_try: int, node_id: str, reason: str
) -> Path:
    """Note that this node's torchrun ended before starting any rank, and why (one line)."""
    path = run.startup_failure(job_id, restart, attempt_try, node_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason.replace("\n", " ") + "\n")
    return path


def startup_failure_line(
    run: RunDir, job_id: str, restart: str, attempt_try: int, endpoint: str, retry: bool
) -> str | None:
    """The one line the batch shell prints when try `attempt_try` failed before any rank
    started (None when it did not: the ranks ran, and their failure is theirs)."""
    reasons = [p.read_text().strip() for p in run.startup_failures(job_id, restart, attempt_try)]
    if not reasons:
        return None
    why = "; ".join(dict.fromkeys(r for r in reasons if r)) or "torchrun exited"
    head = f"paperscale: rendezvous at {endpoint} failed before any rank started ({why})"
    if retry:
        return f"{head}: trying again on a new port (try {attempt_try + 1} of {TRIES})"
    return f"{head}: giving up after {attempt_try} tries"


def arrive(run: RunDir, ctx: dict[str, str], attempt_try: int, received: list[int]) -> bool:
    """Note that this node's task reached the rendezvous (its torchrun starts next); `ctx` is
    launch/slurm/job.py's slurm_context. False under ABSENT_FAULT: the task then waits, as a
    node that never joins, until a signal comes (`received`, see job.record_stop_signals)."""
    if ctx["node_id"] != "0" and os.environ.get(ABSENT_FAULT) == ctx["node_id"]:
        while not received:
            time.sleep(0.1)
        return False
    path = run.node_arrival(ctx["job_id"], ctx["restart"], attempt_try, ctx["node_id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(socket.gethostname() + "\n")
    return True


def absent_nodes(run: RunDir, ctx: dict[str, str], attempt_try: int, nodes: list[str]) -> list[str]:
    """The nodes of the job (`nodes`, in node-id order) whose task never noted its arrival in
    try `attempt_try`: `name (node i)` each."""
    return [
        f"{name} (node {i})"
        for i, name in enumerate(nodes)
        if not run.node_arrival(ctx["job_id"], ctx["restart"], attempt_try, str(i)).exists()
    ]
