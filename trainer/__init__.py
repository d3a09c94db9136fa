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


def inductor_cache_for_this_cpu_capability() -> None:
    """Point inductor's cache at a directory of ATen's CPU capability when ATEN_CPU_CAPABILITY
    picks one and no cache directory is set.

    torch's cache keys miss that variable: kernels compiled under ATEN_CPU_CAPABILITY=avx2 and
    loaded by a process without it corrupted the heap (`malloc(): unaligned tcache chunk
    detected`, exit -6) on torch 2.13, for the same model, on the same machine. Called when
    `trainer` is imported: the first use of inductor's cache (DeepSpeed's engine can make it
    before the model is compiled) fixes its directory, writing the default into the variable.
    """
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if capability and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        import getpass
        import tempfile

        user = getpass.getuser()
        path = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}_{capability}")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path


use_venv_extensions_dir()
use_venv_ninja()
inductor_cache_for_this_cpu_capability()
