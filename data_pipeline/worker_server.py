"""The fork server the loader workers of a rank fork from (data_pipeline/loader.py).

Loader workers are not forked from their rank: a fork while another of its threads (gloo,
DeepSpeed, metric sinks) holds CPython's thread-state lock hangs the child on CPython <= 3.11.7
(gh-112275). They fork from a fork server each rank starts once, which has torch and the producer
loaded (data_pipeline/worker_start.py): a worker starts in milliseconds, not seconds.

multiprocessing starts that server as a new interpreter, which imports torch again: 2-3 s of a
core, which the rank waits out when it asks for its first batch. A rank whose only thread is its
main thread (first thing in `train`, before the process group, the engine or any sink starts a
thread) forks the server from itself instead (`start_early`): torch is already loaded, and a fork
with one thread is the safe case. The child is made to look like a fresh server: the stop
signals blocked and their handlers reset, and every inherited descriptor except the server's own
pointed at /dev/null (so it holds no lock, socket or file of the rank's). Where the rank already
has other threads, or on a Python whose fork server takes other arguments, the server is started
the usual way; so it is where PAPERSCALE_WORKER_SERVER=started asks for it (to compare the two,
bench `startup`, or on a platform where forking the rank misbehaves).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
from multiprocessing import connection, forkserver, resource_tracker, util
from typing import Any

from data_pipeline.worker_signals import STOP_SIGNALS

WORKER_START = "forkserver"
WORKER_PRELOAD = ["data_pipeline.worker_start"]


def worker_context() -> Any:
    """The multiprocessing context of the loader workers (the fork server's preload set)."""
    ctx = mp.get_context(WORKER_START)
    ctx.set_forkserver_preload(WORKER_PRELOAD)
    return ctx


def start_early(num_workers: int | str) -> str:
    """Start this process's fork server now, unless the run has no loader workers
    (`data.num_workers` 0) or one is running. Returns how: `forked` (from this process),
    `started` (a new interpreter, multiprocessing's own way) or `none`."""
    if num_workers == 0:
        return "none"
    worker_context()
    server: Any = forkserver._forkserver  # multiprocessing's one server of this process
    if server._forkserver_pid is not None or not_forkable():
        server.ensure_running()
        return "started"
    fork_server(server)
    return "forked"


SERVER_ENV = "PAPERSCALE_WORKER_SERVER"  # `started`: never forked from the rank


def not_forkable() -> str:
    """Why this process cannot fork the server from itself now ('' when it can)."""
    if os.environ.get(SERVER_ENV, "") == "started":
        return f"{SERVER_ENV}=started"
    if sys.version_info >= (3, 14):
        return "Python >= 3.14 starts its fork server with other arguments"
    if threading.active_count() > 1:
        return f"{threading.active_count()} threads run in this process"
    return ""


def fork_server(server: Any) -> None:
    """multiprocessing's ForkServer.ensure_running (CPython 3.10-3.13), with the server forked
    from this process instead of started as a new interpreter."""
    with server._lock:
        resource_tracker.ensure_running()
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            # every client owns the write end of the "alive" pipe: the server ends at its EOF
            alive_r, alive_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the server; it never returns
                os.close(alive_w)
                serve(listener.fileno(), alive_r)
            os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid


def serve(listener_fd: int, alive_r: int) -> None:
    """The forked server: as a fresh one would be, then multiprocessing's server loop."""
    code = 1
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # as worker_start does
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        keep = {0, 1, 2, listener_fd, alive_r}
        null = os.open(os.devnull, os.O_RDWR)
        for fd in map(int, os.listdir("/proc/self/fd")):
            if fd not in keep and fd != null:  # not closed: a stale object closing it is harmless
                os.dup2(null, fd)
        os.close(null)
        forkserver.main(listener_fd, alive_r, WORKER_PRELOAD)
        code = 0
    except SystemExit:  # the server's end: every client is gone
        code = 0
    finally:
        os._exit(code)
