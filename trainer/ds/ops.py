"""Build DeepSpeed's just-in-time compiled ops once, ahead of training.

DeepSpeed compiles some ops on first use (on CPU ranks: the shared-memory communication op and
the CPU FusedAdam) into ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), under
a lock file. Several ranks starting at once wait on one build; a build that is killed leaves the
lock behind and every later start waits on it forever. Building here, in one process with no
deadline, takes that off the first training run: ``make venv`` runs ``python -m
trainer.ds.ops``, and the Makefile keeps the extensions inside the virtual environment.
"""

from __future__ import annotations

import os
import sys
import time

from trainer import use_venv_extensions_dir

OPS = ("ShareMemCommBuilder", "FusedAdamBuilder")


STALE_LOCK_S = 1800  # no build takes this long; an older lock is a killed build's


def clear_stale_lock(name: str, lines: list[str]) -> None:
    """Remove the build lock of op `name` when it is older than any build takes."""
    from torch.utils.cpp_extension import _get_build_directory

    lock = os.path.join(_get_build_directory(name, verbose=False), "lock")
    try:
        age = time.time() - os.path.getmtime(lock)
    except OSError:
        return
    if age > STALE_LOCK_S:
        os.remove(lock)
        lines.append(f"{name}: removed a stale build lock ({age / 60:.0f} min old)")


def build_ops(names: tuple[str, ...] = OPS) -> list[str]:
    """Build (or find already built) the ops this accelerator supports; returns lines to print."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    lines = []
    for name in names:
        builder = get_accelerator().create_op_builder(name)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            lines.append(f"{name}: not used on this accelerator")
            continue
        clear_stale_lock(builder.NAME, lines)
        start = time.perf_counter()
        try:
            builder.load(verbose=False)
        except Exception as exc:  # e.g. no compiler for this accelerator: DeepSpeed tries again
            lines.append(f"{builder.NAME}: not built ({type(exc).__name__}: {exc})".splitlines()[0])
            continue
        lines.append(f"{builder.NAME}: ready ({time.perf_counter() - start:.1f} s)")
    return lines


def main() -> int:
    use_venv_extensions_dir()
    where = os.environ.get("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions")
    for line in build_ops():
        print(f"deepspeed op {line} in {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
