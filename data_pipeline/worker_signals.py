"""The stop signals in a loader worker: held while it starts, then left to its rank; and the
worker's end when its rank is gone (data_pipeline/loader.py starts the workers)."""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from pathlib import Path

from torch.utils.data import get_worker_info

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Stop signals wait - blocked in this thread, not lost - while loader workers start.

    The loader's fork server, started by the first stream, inherits the mask (and keeps it:
    data_pipeline/worker_start.py), and so does every worker forked from it, so a TERM to every
    process of the job in a worker's first moments, before `ignore_stop_signals` has run in it,
    cannot kill it mid-start (its rank would then fail on a dead worker instead of saving). So
    does multiprocessing's resource tracker, which the first stream starts and which would
    otherwise die of a USR1 sent to every process; starting, it unblocks INT and TERM in this
    thread, hence the second block. The rank itself gets any stop signal as before: another of
    its threads takes it, or this one when the mask is restored.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_stop_signals(worker_id: int) -> None:
    """A loader worker leaves every stop signal to its rank, which finishes its step (or
    abandons it), saves and only then closes its stream.

    USR1 (Slurm's warning before the time limit) and INT (Ctrl-C, sent to the whole process
    group) are ignored. TERM - Slurm's preemption or `scancel` reach every process of the job,
    workers included - is ignored too while the rank still reads batches; once the rank closes
    its stream (`TokenBatchStream.close`, also at the rank's exit), a TERM ends the worker at
    once: the DataLoader and multiprocessing end workers with TERM at shutdown, and a worker
    that ignored it then would hang its rank's exit. A worker whose rank is gone (killed, so
    that it could close nothing) exits by itself (`exit_with_rank`).
    """
    for sig in (signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    info = get_worker_info()
    dataset = info.dataset if info is not None else None
    closing = getattr(dataset, "closing", None)
    rank = getattr(dataset, "rank_pid", None) or os.getppid()
    exit_with_rank(rank)

    def on_term(signum: int, frame: object) -> None:
        if (closing is not None and closing.is_set()) or not process_alive(rank):
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held since its start


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (and is not a zombie waiting for its parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def exit_with_rank(rank_pid: int) -> None:
    """End this process as soon as process `rank_pid` is gone: a thread waits on its pidfd.

    A worker is forked from the rank's fork server (data_pipeline/loader.py), so its parent is
    the server, not the rank, and the DataLoader's own check (is my parent still there?) would
    not see the rank die; the server in turn stays while a worker it made lives, so neither
    would ever end after a SIGKILL of the rank."""

    def wait() -> None:
        try:
            fd = os.pidfd_open(rank_pid)
        except OSError:  # already gone
            os._exit(0)
        select.select([fd], [], [])  # readable once the process has exited
        os._exit(0)

    threading.Thread(target=wait, name="exit-with-rank", daemon=True).start()
