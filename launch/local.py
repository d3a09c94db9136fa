"""Starting N local training processes through torchrun."""

from __future__ import annotations

import os
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
    return env


def run_torchrun(nproc: int, config_file: Path, run_dir: Path, use_cuda: bool) -> int:
    """Run torchrun in the foreground and return its exit code."""
    cmd = torchrun_command(nproc, config_file, run_dir)
    return subprocess.call(cmd, env=child_env(use_cuda))


def use_cuda(device: str) -> bool:
    """Whether `train.device` resolves to CUDA on this machine."""
    import torch

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())
