"""Training: engine, step, loop, checkpoints, metrics, serving exports."""

import os
import sys


def use_venv_extensions_dir() -> None:
    """In a virtual environment, keep DeepSpeed's JIT-compiled ops in it (unless the user chose
    ``TORCH_EXTENSIONS_DIR``): a new venv starts with no stale build lock and no ops compiled
    against another torch (see trainer/ds/ops.py)."""
    if "TORCH_EXTENSIONS_DIR" not in os.environ and sys.prefix != sys.base_prefix:
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(sys.prefix, "torch_extensions")


use_venv_extensions_dir()
