"""The attempts of a run: every start of its worker group, how each ended, and crash loops.

RUN/attempts.jsonl gets one line when an attempt starts (rank 0: the checkpoint it resumes,
torchrun's restart count, Slurm's job and restart count), one when a rank fails with an
exception (that rank: the step and the error in one line) and one when the attempt ends (rank
0: its exit code). An attempt killed outright (SIGKILL, the OOM killer, a lost node) leaves only
its start line.

A crash loop is `train.crash_loop_attempts` attempts in a row that resumed from the same
checkpoint and did not end: the same failure at the same place, again and again (a bad batch,
a config that always runs out of memory). The next attempt then does not train: it stops with
one line naming the checkpoint, the step and the last error, and EXIT_CRASH_LOOP, which
neither torchrun's restarts nor the Slurm job's requeue repeat.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_CRASH_LOOP = 70  # EX_SOFTWARE: the same failure again and again; nothing retries it


def restart_count() -> int:
    """torchrun's restarts of this worker group so far (TORCHELASTIC_RESTART_COUNT)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def announce_attempt(max_restarts: int) -> None:
    """The line that says this attempt is a restart in place (rank 0 calls it)."""
    if restart_count():
        print(
            f"attempt {restart_count() + 1}: the worker group restarted in place "
            f"(restart {restart_count()} of train.max_restarts={max_restarts})",
            flush=True,
        )


@dataclass
class Attempt:
    """What the record says of one attempt."""

    resumed: str | None
    ended: bool = False
    error: str | None = None
    step: int | None = None


def read_attempts(path: Path) -> list[Attempt]:
    """The attempts in the record, oldest first (unreadable lines are skipped)."""
    out: list[Attempt] = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            event: dict[str, Any] = json.loads(line)
        except ValueError:
            continue
        kind = event.get("event")
        if kind == "start":
            out.append(Attempt(event.get("resumed")))
        elif out and kind == "end":
            out[-1].ended = True
        elif out and kind == "error":
            out[-1].error, out[-1].step = event.get("error"), event.get("step")
    return out


def crash_loop(attempts: list[Attempt], resumes: str | None, limit: int) -> str | None:
    """Why the attempt about to resume `resumes` must not start, or None: the last `limit`
    attempts resumed from it too and none of them ended."""
    last = attempts[-limit:]
    if len(last) < limit or any(a.ended or a.resumed != resumes for a in last):
        return None
    failed = next((a for a in reversed(last) if a.error), None)
    where = f"checkpoint {resumes}" if resumes else "the start (no checkpoint)"
    step = f" at step {failed.step}" if failed and failed.step is not None else ""
    error = failed.error if failed else "no error recorded: killed, e.g. by SIGKILL or OOM"
    return (
        f"crash loop: the last {limit} attempts resumed from {where} and failed{step} before "
        f"the next checkpoint ({error}); stopped (train.crash_loop_attempts={limit})"
    )


def append_event(path: Path, event: dict[str, Any]) -> None:
    """One line, appended in one write (O_APPEND: ranks may append at the same time)."""
    line = json.dumps({**event, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def start_event(resumed: str | None) -> dict[str, Any]:
    return {
        "event": "start",
        "resumed": resumed,
        "restart": restart_count(),
        "slurm_job": os.environ.get("SLURM_JOB_ID", ""),
        "slurm_restart": os.environ.get("SLURM_RESTART_COUNT", ""),
    }


def agree_on_start(run: Any, limit: int, env: Any) -> dict[str, Any] | None:
    """Rank 0 reads the record: a crash loop gives the summary of a run stopped on it (every
    rank returns it, so all exit together), else rank 0 records this attempt's start."""
    import torch.distributed as dist

    answer: list[Any] = [None]
    if env.is_main:
        report_watchdogs(run)  # the previous attempt's stuck ranks, if any
        resumes = run.checkpoints.latest_tag()
        answer = [crash_loop(read_attempts(run.attempts), resumes, limit)]
        if answer[0] is None:
            append_event(run.attempts, start_event(resumes))
    dist.broadcast_object_list(answer, src=0)
    if answer[0] is None:
        return None
    if env.is_main:
        print(f"paperscale: error: {answer[0]}", file=sys.stderr, flush=True)
    # every rank leaves the group together: a rank still in the broadcast when its peer's
    # process is gone reads a reset socket and aborts, and torchrun restarts the group again
    dist.barrier()
    dist.destroy_process_group()
    return {"preempted": False, "exit_code": EXIT_CRASH_LOOP, "error": answer[0]}


def attempt_key() -> str:
    """This attempt's name in file names: Slurm job and restart, torchrun's restart."""
    job = os.environ.get("SLURM_JOB_ID", "") or "local"
    return f"{job}.{os.environ.get('SLURM_RESTART_COUNT', '') or 0}.{restart_count()}"


def report_watchdogs(run: Any) -> list[str]:
    """One line per rank whose watchdog ended it since the last report (where its main thread
    was stuck, and the file with every thread's stack), printed and recorded as that rank's
    error; the files are renamed so each is reported once."""
    from trainer.run_dir import REPORTED_SUFFIX
    from trainer.signals import stuck_at
    from trainer.startup import waiting_for

    lines = []
    for path in run.unreported_watchdogs():
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace")
            if not text.strip():
                path.unlink()  # a rank that was killed otherwise, before its watchdog fired
                continue
            attempt, rank_text = path.stem.removeprefix("watchdog-").rsplit("-rank", 1)
            rank, fired = int(rank_text), path.stat().st_mtime
            kept = path.with_name(path.stem + REPORTED_SUFFIX)
            path.rename(kept)
            start_up = waiting_for(run.logs, attempt, rank, fired)  # '' past its first step
            line = (
                f"watchdog: rank {rank} ran past train.dist_timeout_s, stuck in "
                f"{stuck_at(text)}{', ' + start_up if start_up else ''} "
                f"(every thread's stack: {kept})"
            )
            append_event(run.attempts, {"event": "error", "rank": rank, "step": None,
                                        "error": line})  # fmt: skip
            print(f"paperscale: {line}", file=sys.stderr, flush=True)
            lines.append(line)
    return lines


def record_failure(run: Any, env: Any, step: int | None, exc: BaseException) -> None:
    """This rank failed with `exc` in step `step` (None: before the first): one line."""
    with contextlib.suppress(OSError):
        event = {"event": "error", "rank": env.rank, "step": step, "error": one_line(exc)}
        append_event(run.attempts, event)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
