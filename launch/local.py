"""Starting N local training processes through torchrun."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path


def inside_torchrun() -> bool:
    """True in a process that torchrun (or srun + torchrun) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def torchrun_command(nproc: int, config_file: Path, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "launch.cli",
        "train",
        "--config",
        str(config_file),
        f"run.dir={run_dir}",
    ]


def child_env(use_cuda: bool) -> dict[str, str]:
    env = dict(os.environ)
    if not use_cuda:
        env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("OMP_NUM_THREADS", "1")
    # After a restart (--max-restarts) workers sharing the rendezvous store can read the
    # previous attempt's addresses and fail to connect; a store of their own avoids that.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`, read from /proc (torchrun's workers)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def run_torchrun(nproc: int, config_file: Path, run_dir: Path, use_cuda: bool) -> int:
    """Run torchrun in the foreground and return its exit code.

    SIGUSR1 and SIGTERM sent to this process go straight to the workers, which finish their
    step, save and exit (torchrun itself would die on USR1 and give SIGTERM only a short grace
    period). SIGINT from a terminal reaches the workers through the process group, so it is
    not forwarded again here.
    """
    proc = subprocess.Popen(torchrun_command(nproc, config_file, run_dir), env=child_env(use_cuda))

    def forward(signum: int, frame: object) -> None:
        for pid in child_pids(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def use_cuda(device: str) -> bool:
    """Whether `train.device` resolves to CUDA on this machine."""
    import torch

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())
