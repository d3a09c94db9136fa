"""The local launcher: which device `auto` means, and a start that leaves torch to torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from launch.local import child_pids, rank_pids, use_cuda

ROOT = Path(__file__).resolve().parents[2]


def test_auto_without_gpu_device_nodes_is_the_cpu_and_imports_no_torch() -> None:
    code = (
        "import sys; from launch.local import use_cuda; "
        "print(use_cuda('auto', ('/nonexistent/nvidiactl',)), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_explicit_devices_and_auto_with_device_nodes() -> None:
    assert use_cuda("cuda") and not use_cuda("cpu")
    # a node that exists (a stand-in here): torch decides
    assert use_cuda("auto", ("/dev/null",)) == torch.cuda.is_available()


def test_train_hands_over_to_torchrun_without_importing_torch(
    data_dir: Path, tmp_path: Path
) -> None:
    """Everything `paperscale train --nproc 2` does before torchrun starts (config, checks, the
    run dir) runs without torch, which torchrun and every rank import again anyway."""
    (data_dir / "spm.model").write_bytes(b"stand-in")  # copied into the run dir, not read
    run = tmp_path / "run"
    code = f"""
import sys
import launch.local as local
def torchrun(*args, **kwargs):
    print("torch imported before torchrun:", "torch" in sys.modules)
    return 0
local.run_torchrun = torchrun
local.GPU_DEVICE_NODES = ()
from launch.cli import main
main(["train", "--config", "{ROOT}/configs/tiny.yaml", "--nproc", "2", "--run-dir", "{run}",
      "data.dir={data_dir}"])
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert "torch imported before torchrun: False" in out.stdout, out.stdout + out.stderr
    assert (run / "config.yaml").is_file()


def test_the_workers_of_an_agent_are_its_python_children() -> None:
    """What the launcher and a Slurm node task signal and count as started ranks: this
    Python in a session of its own (as torchrun starts a rank, and as a forked rank makes
    itself); not a compiler the agent runs while it loads DeepSpeed's ops, nor the fork of the
    agent that is about to exec one (this Python, in the agent's session: a Slurm job once took
    it for a rank and so a failed rendezvous for a failed job)."""
    import os
    import time

    compiler = subprocess.Popen(["sleep", "30"])
    about_to_exec = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    children = (compiler, about_to_exec, rank)
    try:
        deadline = time.monotonic() + 10  # until the rank has exec'd this Python
        while rank.pid not in rank_pids(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rank_pids(os.getpid()) == [rank.pid]
        assert {c.pid for c in children} <= set(child_pids(os.getpid()))
    finally:
        for child in children:
            child.kill()
            child.wait()
