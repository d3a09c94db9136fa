"""Training: engine, step, loop, checkpoints, metrics, serving exports."""

import os
import sys


def use_venv_extensions_dir() -> None:
    """In a virtual environment, keep DeepSpeed's JIT-compiled ops in it (unless the user chose
    ``TORCH_EXTENSIONS_DIR``): a new venv starts with no stale build lock and no ops compiled
    against another torch (see trainer/ds/ops.py)."""
    if "TORCH_EXTENSIONS_DIR" not in os.environ and sys.prefix != sys.base_prefix:
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(sys.prefix, "torch_extensions")


def use_venv_ninja() -> None:
    """In a virtual environment with its own ninja (pip's, which DeepSpeed requires), build
    DeepSpeed's ops with that one whatever PATH holds: ninja 1.11 and 1.12+ hash a build
    command differently, so a system ninja and the venv's taking turns (a shell with the venv
    activated, one without) rebuilt the ops at every start (~25 s of CPU, under the build lock
    a process killed meanwhile leaves behind)."""
    venv_bin = os.path.join(sys.prefix, "bin")
    if sys.prefix == sys.base_prefix or not os.path.exists(os.path.join(venv_bin, "ninja")):
        return
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != venv_bin:
        os.environ["PATH"] = os.pathsep.join(filter(None, [venv_bin, path]))


use_venv_extensions_dir()
use_venv_ninja()
