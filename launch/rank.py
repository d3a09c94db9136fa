"""A rank forked from the agent (launch/agent.py): `paperscale train` with torchrun's rank env.

torchrun runs this file (`--run-path`) in each forked child. First it makes the child what a
rank started as a new interpreter is: a session of its own (torchrun starts each rank so),
the default action for the signals the agent handles in Python, no death signal from its parent
(torch sets SIGINT: a rank outlives its agent as an exec'd one does), and no file descriptor
of the run dir's lock (a rank does not hold the run), and none of the exit handlers the agent
registered for itself. At the end it runs the exit handlers that a forked child would skip
(multiprocessing ends it with os._exit): the loader's workers are stopped there.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def become_a_rank() -> None:
    with contextlib.suppress(PermissionError):  # already a session leader
        os.setsid()
    for sig in signal.valid_signals():
        handler = signal.getsignal(sig)  # the agent's Python handlers (torchrun's HUP, QUIT)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
    close_run_lock()
    from launch.agent import AGENT_EXIT_HANDLERS

    for func in AGENT_EXIT_HANDLERS:
        atexit.unregister(func)


def close_run_lock() -> None:
    """Close this process's descriptors of RUN/.lock (inherited from the agent, which holds
    the run for the launcher): the lock is dropped when its holders end, and a rank is not
    one."""
    from trainer.run_lock import HOLDER_ENV

    held = os.environ.get(HOLDER_ENV)
    if not held:
        return
    path = os.path.realpath(held)
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") == path:
                os.close(int(name))


def main() -> int:
    become_a_rank()
    from launch.cli import main as paperscale

    try:
        return paperscale(sys.argv[1:])
    finally:
        sys.stdout.flush()
        atexit._run_exitfuncs()


if __name__ == "__main__":
    sys.exit(main())
