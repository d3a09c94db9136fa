"""How ranks start (launch/agent.py, launch/rank.py): forked from a preloaded torchrun agent on
CPU runs, new interpreters with CUDA; and what a forked child makes of itself before it is a
rank. The runs themselves: tests/integration/test_rank_start.py."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import json
import os
import signal
from pathlib import Path

import pytest

from launch.agent import AGENT_EXIT_HANDLERS, RANK_SCRIPT, rank_start
from launch.config import ConfigError
from launch.local import torchrun_command
from launch.rank import become_a_rank
from launch.slurm.job import torchrun_command as node_torchrun_command
from trainer.run_lock import HOLDER_ENV

PR_GET_PDEATHSIG = 2


def open_files() -> set[str]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            out.add(os.readlink(f"/proc/self/fd/{name}"))
    return out


@pytest.mark.parametrize(
    ("cuda", "value", "start"),
    [(False, None, "fork"), (False, "auto", "fork"), (False, "fork", "fork"),
     (False, "exec", "exec"), (True, None, "exec"), (True, "fork", "exec")],
)  # fmt: skip
def test_cpu_ranks_are_forked_and_cuda_ranks_exec(
    cuda: bool, value: str | None, start: str
) -> None:
    environ = {} if value is None else {"PAPERSCALE_RANK_START": value}
    assert rank_start(cuda, environ) == start


def test_an_unknown_rank_start_is_one_line_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"^PAPERSCALE_RANK_START: 'spawn': must be auto, fork"):
        rank_start(False, {"PAPERSCALE_RANK_START": "spawn"})


def test_the_commands_of_both_starts() -> None:
    forked = torchrun_command(2, Path("/r/config.yaml"), Path("/r"), start="fork")
    assert forked[1:3] == ["-m", "launch.agent"]
    script = forked.index(str(RANK_SCRIPT))
    assert {"--run-path", "--start-method=fork"} <= set(forked[:script])
    assert forked[script + 1 :] == ["train", "--config", "/r/config.yaml", "run.dir=/r"]
    execd = torchrun_command(2, Path("/r/config.yaml"), Path("/r"), start="exec")
    assert execd[1:3] == ["-m", "torch.distributed.run"]
    assert execd[-6:] == ["-m", "launch.cli", "train", "--config", "/r/config.yaml", "run.dir=/r"]
    assert "--run-path" not in execd
    node = node_torchrun_command("py", Path("/r"), 2, 2, "n1:1", "7", True, start="fork")
    assert node[:3] == ["py", "-m", "launch.agent"] and str(RANK_SCRIPT) in node
    for cmd in (forked, execd, node):  # torchrun's records stay with the run, not in /tmp
        assert "--log-dir=/r/logs/torchrun" in cmd[: cmd.index("train")]


def test_a_forked_child_becomes_a_rank(tmp_path: Path) -> None:
    """In a child forked from a process that holds the run's lock, handles HUP in Python,
    registered an exit handler of its own and was given a death signal (as torch's
    multiprocessing gives SIGINT): its own session, HUP at its default, no death signal, no
    descriptor of the lock (other descriptors kept), the agent's exit handler dropped."""
    lock_path = tmp_path / ".lock"
    lock = open(lock_path, "w")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX)
    other = open(tmp_path / "other", "w")  # noqa: SIM115
    read_end, write_end = os.pipe()
    previous = signal.signal(signal.SIGHUP, lambda *_: None)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGINT), 0, 0, 0)
            os.environ[HOLDER_ENV] = str(lock_path)
            atexit._clear()  # (pytest's own, not to be run here)
            ran: list[str] = []
            agents = atexit.register(lambda: ran.append("the agent's"))  # for the agent itself
            AGENT_EXIT_HANDLERS.append(agents)
            atexit.register(lambda: ran.append("a module's"))  # e.g. of a module it preloaded
            become_a_rank()
            deathsig = ctypes.c_int(-1)
            libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(deathsig), 0, 0, 0)
            fds = open_files()
            report = {
                "session_leader": os.getsid(0) == os.getpid(),
                "hup_default": signal.getsignal(signal.SIGHUP) == signal.SIG_DFL,
                "deathsig": deathsig.value,
                "holds_lock": str(lock_path) in fds,
                "keeps_other": str(tmp_path / "other") in fds,
            }
            atexit._run_exitfuncs()
            report["exit_handlers_run"] = ran
            os.write(write_end, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    signal.signal(signal.SIGHUP, previous)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    report = json.loads(os.read(read_end, 4096))
    os.close(read_end)
    other.close()
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == {"session_leader": True, "hup_default": True, "deathsig": 0,
                      "holds_lock": False, "keeps_other": True,
                      "exit_handlers_run": ["a module's"]}  # fmt: skip
    # the parent's lock is untouched: another open file description cannot take it
    with open(lock_path) as again, pytest.raises(BlockingIOError):
        fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.close()
