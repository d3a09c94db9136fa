"""Where each rank is in its start-up, so that a rank whose first collective times out can say
which peer it waited for.

Until its first step is done, every rank keeps one line in RUN/logs/start-<attempt>-rank<r>.txt:
the phase it is in, when it entered it, its host and pid, the world size and torchrun's run id
(the records of an earlier start of the group are not read as this one's). The phases, in order:

  start          the process runs `train` (before the loader's fork server)
  process group  joining the process group (the rendezvous of the ranks, train.dist_timeout_s)
  agree          rank 0 reads the run's attempts; the first collective
  settle         precision, world size and every `auto`, agreed between the ranks
  build          the engine (its parameters broadcast), the data stream, the checkpoint manager
  restore        the latest checkpoint read, the sinks opened
  first step     the first optimizer step (its collectives)

A collective that does not answer within train.dist_timeout_s raises on the ranks that wait in
it. Such a rank reads its peers' lines and names the ones behind it (or never started) in one
line, instead of gloo's or NCCL's timeout, which names no rank. A rank stuck after its first
step is the loop's watchdog's (trainer/signals.py). The run dir is shared by the nodes of a job
(its checkpoints are), so the lines of every node are there to read.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PHASES = ("start", "process group", "agree", "settle", "build", "restore", "first step")
DONE = "done"  # after the first step: the file is removed
NAMED_AT_MOST = 4  # peers named in the line; the rest counted


@dataclass(frozen=True)
class Record:
    """One rank's start-up line."""

    rank: int
    phase: str
    since: float  # time.time() when it entered `phase`
    host: str
    pid: int
    world_size: int
    launch: str  # torchrun's run id: the records of one start of the group share it

    @property
    def order(self) -> int:
        return PHASES.index(self.phase) if self.phase in PHASES else -1

    def line(self) -> str:
        since = f"{self.since:.3f}"
        fields = (self.phase, since, self.host, self.pid, self.world_size, self.launch)
        return "\t".join(map(str, fields)) + "\n"


def record_path(logs: Path, attempt: str, rank: int) -> Path:
    return logs / f"start-{attempt}-rank{rank:05d}.txt"


def read_record(logs: Path, attempt: str, rank: int) -> Record | None:
    """Rank `rank`'s start-up line in attempt `attempt` (None: it has none)."""
    try:
        text = record_path(logs, attempt, rank).read_text()
        phase, since, host, pid, world, launch = text.rstrip("\n").split("\t")
        return Record(rank, phase, float(since), host, int(pid), int(world), launch)
    except (OSError, ValueError):
        return None


class StartTrace:
    """This rank's start-up line, kept current until its first step is done."""

    def __init__(
        self, logs: Path, attempt: str, rank: int, world_size: int, hang_before: str = ""
    ) -> None:
        self.logs, self.attempt, self.rank, self.world_size = logs, attempt, rank, world_size
        self.hang_before = hang_before  # a fault test's phase this rank never enters
        self.phase = ""

    def enter(self, phase: str) -> None:
        """Record that this rank entered `phase` (one of PHASES; DONE removes the record)."""
        if phase == self.hang_before:
            from trainer.faults import hang

            hang(f"hanging before {phase!r}")
        if self.phase == DONE:
            return
        path = record_path(self.logs, self.attempt, self.rank)
        self.phase = phase
        with contextlib.suppress(OSError):  # the record helps a failure; it never makes one
            if phase == DONE:
                path.unlink()
                return
            record = Record(self.rank, phase, time.time(), socket.gethostname(), os.getpid(),
                            self.world_size, os.environ.get("TORCHELASTIC_RUN_ID", ""))  # fmt: skip
            self.logs.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            tmp.write_text(record.line())
            os.replace(tmp, path)

    def fail(self, timeout_s: float, exc: BaseException) -> None:
        """Say whom this rank waited for, when `exc` is a collective of its start-up that did
        not answer."""
        if self.phase in ("", DONE) or not waited_for_peers(exc):
            return
        line = waiting_for(self.logs, self.attempt, self.rank, time.time())
        if line:
            head = f"rank {self.rank} ({socket.gethostname()}) {how_it_ended(exc, timeout_s)}"
            print(f"paperscale: error: {head} {line}", file=sys.stderr, flush=True)


def how_it_ended(exc: BaseException, timeout_s: float) -> str:
    """A collective of the start-up that ran out of time, or one whose peer went away."""
    text = str(exc).lower()
    if "timed out" in text or "timeout" in text:
        return f"waited train.dist_timeout_s={timeout_s:g} s"
    return "lost a peer's connection (a rank that exited or died)"


def waiting_for(logs: Path, attempt: str, rank: int, now: float) -> str:
    """Where rank `rank` was in its start-up and which peers were behind it at `now`
    ('' when it had finished its start-up or left no record)."""
    mine = read_record(logs, attempt, rank)
    if mine is None or mine.order < 0:
        return ""
    peers = {r: read_record(logs, attempt, r) for r in range(mine.world_size) if r != rank}
    # a record of another start of the group (a local attempt's key repeats from one `train`
    # to the next) is none of this one's: that rank never started this time
    peers = {r: p if p and p.launch == mine.launch else None for r, p in peers.items()}
    behind = [(r, p) for r, p in sorted(peers.items()) if p is None or p.order < mine.order]
    head = f"in its start-up at {mine.phase!r}"
    if not behind:
        return (
            f"{head}, and every rank got there: the collective itself did not answer "
            f"(a network the ranks cannot reach each other on? docs/slurm.md, interfaces)"
        )
    named = [describe(r, peer, now) for r, peer in behind[:NAMED_AT_MOST]]
    more = len(behind) - len(named)
    rest = f" and {more} more rank{'s' if more > 1 else ''}" if more else ""
    return f"{head} for {'; '.join(named)}{rest}"


def describe(rank: int, peer: Record | None, now: float) -> str:
    if peer is None:
        return f"rank {rank}, which never started (no start-up record)"
    return (
        f"rank {rank} ({peer.host}, pid {peer.pid}), still at {peer.phase!r} since "
        f"{max(0.0, now - peer.since):.0f} s"
    )  # (`now` may be a file's time, which the kernel keeps coarser than time.time())


def start_trace(run_logs: Path) -> StartTrace:
    """This process's trace, from the environment torchrun (or srun) sets, at "start"."""
    from trainer.attempts import attempt_key
    from trainer.faults import start_hang

    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    trace = StartTrace(run_logs, attempt_key(), rank, world_size, start_hang(rank))
    trace.enter("start")
    return trace


def waited_for_peers(exc: BaseException) -> bool:
    """Whether `exc` is a collective or rendezvous that did not answer (or lost its peer): a
    torch.distributed or RuntimeError whose text says so. Other errors of the process group
    (this rank's own store failing to listen on its port, say) name no peer."""
    text = str(exc).lower()  # torch.distributed's DistError is a RuntimeError
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("timed out", "timeout", "connection closed", "connection reset")
    )
