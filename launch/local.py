"""Starting N local training processes through torchrun."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

from launch.agent import rank_command, torchrun_program
from trainer.run_dir import RunDir


def inside_torchrun() -> bool:
    """True in a process that torchrun (or srun + torchrun) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def torchrun_command(
    nproc: int,
    config_file: Path,
    run_dir: Path,
    grace_s: float = 30.0,
    max_restarts: int = 0,
    start: str = "exec",
) -> list[str]:
    """torchrun for `nproc` local ranks. On TERM torchrun itself passes TERM on to its ranks
    and kills them after --shutdown_timeout: that is the run's grace period, in which they
    save and exit. A rank that fails makes torchrun restart the whole group in place, up to
    `max_restarts` times (train.max_restarts); each restart resumes from `latest`. `start`:
    how ranks start (launch/agent.py: "fork" from a preloaded agent, or "exec")."""
    placement = ["--standalone", f"--nproc_per_node={nproc}"]
    return [*torchrun_program(start), *placement,
            *train_args(config_file, run_dir, grace_s, max_restarts, start)]  # fmt: skip


def train_args(
    config_file: Path, run_dir: Path, grace_s: float, max_restarts: int, start: str = "exec"
) -> list[str]:
    """torchrun's arguments after where its ranks run (locally or on a job's nodes): restarts
    of the group, the grace period on TERM, the signals it handles itself, and the ranks'
    command (`paperscale train` of `config_file` into `run_dir`, forked or a new
    interpreter as `start` says). torchrun's own records (a folder per attempt, a failed rank's
    error.json) go to RUN/logs/torchrun, with the run, not to a new folder in /tmp each start."""
    return [
        f"--max-restarts={max_restarts}",
        f"--log-dir={RunDir(run_dir).torchrun_logs}",
        f"--shutdown_timeout={math.ceil(grace_s)}",
        # torchrun leaves TERM and INT to the ranks (it ignores them: see run_torchrun) and
        # waits for them to save and exit instead of killing them after a traceback
        f"--signals_to_handle={TORCHRUN_SIGNALS}",
        *rank_command(start),
        *("train", "--config", str(config_file), f"run.dir={run_dir}"),
    ]


TORCHRUN_SIGNALS = "SIGHUP,SIGQUIT"


def ignore_stop_signals() -> None:
    """In torchrun (before exec): TERM, INT and USR1 - sent by Slurm or a terminal to every
    process - are for the ranks, which install their own handlers first thing."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


def child_env(use_cuda: bool) -> dict[str, str]:
    env = dict(os.environ)
    if not use_cuda:
        env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("OMP_NUM_THREADS", "1")
    # what torchrun's `python -u` gives a new interpreter, for ranks forked from the agent
    env.setdefault("PYTHONUNBUFFERED", "1")
    # After a restart (--max-restarts) workers sharing the rendezvous store can read the
    # previous attempt's addresses and fail to connect; a store of their own avoids that.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields after the command name: state, ppid, pgrp, session, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`, read from /proc (torchrun's workers)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = _stat_fields(stat.parent.name)
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def rank_pids(agent: int) -> list[int]:
    """torchrun's workers: the agent's children that run this Python in a session of their
    own (torchrun starts each rank so; a forked one makes itself one first, launch/rank.py).
    Not the compilers the agent runs while it loads DeepSpeed's ops (launch/agent.py), not even
    in the instant between their fork and their exec, when they too are this Python."""
    python = os.path.realpath(sys.executable)
    out = []
    for pid in child_pids(agent):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if os.path.realpath(f"/proc/{pid}/exe") == python and int(_stat_fields(pid)[3]) == pid:
                out.append(pid)
    return out


def run_torchrun(
    nproc: int,
    config_file: Path,
    run_dir: Path,
    use_cuda: bool,
    grace_s: float = 30.0,
    keep_fds: tuple[int, ...] = (),
    max_restarts: int = 0,
    start: str = "exec",
) -> int:
    """Run torchrun in the foreground and return its exit code.

    SIGUSR1 and SIGTERM sent to this process go straight to the workers, which stop at a step
    boundary, save and exit; torchrun ignores them and waits for its workers. SIGINT from a
    terminal reaches the workers through the process group, so it is not forwarded again here.
    `keep_fds` stay open in torchrun (the run dir's lock: it lives as long as either does).
    """
    command = torchrun_command(nproc, config_file, run_dir, grace_s, max_restarts, start)
    proc = subprocess.Popen(
        command, env=child_env(use_cuda), preexec_fn=ignore_stop_signals, pass_fds=keep_fds
    )

    def forward(signum: int, frame: object) -> None:
        for pid in rank_pids(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# Device nodes without which no CUDA (NVIDIA) or ROCm (AMD, torch.cuda too) device is visible.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")


def use_cuda(device: str, device_nodes: tuple[str, ...] | None = None) -> bool:
    """Whether `train.device` resolves to CUDA on this machine.

    On a machine without GPU device nodes `auto` is the CPU without importing torch (about
    2 s of the launcher's start, before torchrun can begin); elsewhere torch decides."""
    if device != "auto":
        return device == "cuda"
    nodes = GPU_DEVICE_NODES if device_nodes is None else device_nodes
    if not any(os.path.exists(node) for node in nodes):
        return False
    import torch

    return torch.cuda.is_available()
