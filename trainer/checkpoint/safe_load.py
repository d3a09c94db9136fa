"""Checkpoint files are read with `weights_only=True` everywhere, DeepSpeed's own loads included.

DeepSpeed calls `torch.load(..., weights_only=False)`, which would run any code a crafted
pickle names. `forbid_code_in_checkpoints()` sets TORCH_FORCE_WEIGHTS_ONLY_LOAD, which makes
torch use its restricted unpickler whatever the caller asks (child processes inherit it), and
allows the few plain DeepSpeed classes its checkpoints hold.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

FORCE_ENV = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"


def deepspeed_safe_globals() -> list[Any]:
    """The non-tensor classes DeepSpeed writes into its checkpoint files (plain data)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [fragment_address, LossScaler, DynamicLossScaler, ZeroStageEnum]


def forbid_code_in_checkpoints() -> None:
    """Make every torch.load in this process (and its children) weights-only."""
    os.environ[FORCE_ENV] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    torch.serialization.add_safe_globals(deepspeed_safe_globals())


def check_loadable(path: Path) -> str | None:
    """None when `path` reads as a weights-only torch file; otherwise why not, in one line.

    Tensors are memory-mapped, not read, so this is cheap for large optimizer partitions.
    """
    forbid_code_in_checkpoints()
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights only load failed" in first.lower() or "Unsupported global" in str(exc):
            return f"{path} holds objects that loading would have to run code for; refused"
        return f"{path} is not a readable torch checkpoint file ({first[:120]})"
    return None


def run_module_weights_only(argv: list[str]) -> None:
    """`python -m trainer.checkpoint.safe_load MODULE ARGS...`: run MODULE as a script with
    weights-only loading (DeepSpeed's checkpoint tools, e.g. ds_to_universal)."""
    import runpy
    import sys

    forbid_code_in_checkpoints()
    sys.argv = argv
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    import sys

    run_module_weights_only(sys.argv[1:])
