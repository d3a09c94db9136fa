"""The machine a bench ran on, as RESULTS.md states it: CPU model, cores, native bf16, GPU,
and the versions of Python, torch and DeepSpeed."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from launch.cost_model.speed import cpu_model


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def machine_info() -> dict[str, Any]:
    """CPU model, cores, native bf16 (torch's view of the instruction set, as
    `train.precision: auto` reads it), GPU name or "none", and the software versions."""
    import torch

    from trainer.precision import cpu_has_native_bf16

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 0,
        "native_bf16": bool(cpu_has_native_bf16()),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": _version("deepspeed"),
    }


def describe_machine(m: Mapping[str, Any]) -> str:
    """The machine in one table cell: 'AMD EPYC, 2 cores, native bf16: no, GPU: none'."""
    bf16 = {True: "yes", False: "no"}.get(m["native_bf16"], "not recorded")
    return f"{m['cpu']}, {m['cores']} cores, native bf16: {bf16}, GPU: {m['gpu']}"
