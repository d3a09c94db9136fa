"""Build DeepSpeed's just-in-time compiled ops once, ahead of training.

DeepSpeed compiles some ops on first use (on CPU ranks: the shared-memory communication op and
the CPU FusedAdam) into ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), under
a lock file. Several ranks starting at once wait on one build; a build that is killed leaves the
lock behind and every later start waits on it forever. Building here, in one process with no
deadline, takes that off the first training run: ``make venv`` runs ``python -m
trainer.ds.ops``, and the Makefile keeps the extensions inside the virtual environment.

Every process that loads an op takes the lock for a moment (torch runs ninja under it even when
nothing is to be built), so a rank killed at its start can leave it too. Before DeepSpeed loads
its ops, each rank therefore waits for a held lock saying so in one line, and removes one older
than any build takes (`wait_for_build_locks`): a killed start costs minutes, not the run.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainer import use_venv_extensions_dir

OPS = ("ShareMemCommBuilder", "FusedAdamBuilder")


STALE_LOCK_S = 300  # these ops build in ~30 s on 2 cores; an older lock is a killed build's


def lock_age(lock: Path) -> float | None:
    """Seconds since `lock` was taken, or None when nobody holds it."""
    try:
        return time.time() - lock.stat().st_mtime
    except OSError:
        return None


def clear_stale_lock(name: str, lines: list[str]) -> None:
    """Remove the build lock of op `name` when it is older than any build takes."""
    lock = build_lock(name)
    age = lock_age(lock)
    if age is not None and age > STALE_LOCK_S:
        lock.unlink(missing_ok=True)
        lines.append(f"{name}: removed a stale build lock ({age / 60:.0f} min old)")


def build_lock(name: str) -> Path:
    """The lock file torch's JIT loader takes while it builds (or checks) op `name`."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False), "lock")


def op_locks(names: Sequence[str] = OPS) -> list[Path]:
    """The build locks of the ops this accelerator loads (DS_ACCELERATOR set before)."""
    from deepspeed.accelerator import get_accelerator

    builders = [get_accelerator().create_op_builder(name) for name in names]
    return [build_lock(b.NAME) for b in builders if b is not None]


def wait_for_build_locks(
    locks: Sequence[Path],
    log: Callable[[str], None],
    stale_s: float = STALE_LOCK_S,
    poll_s: float = 1.0,
    quiet_s: float = 5.0,
) -> None:
    """Return once no lock in `locks` is held: while one is younger than `stale_s` (a build in
    progress, maybe another rank's), wait, saying so once after `quiet_s` (a load holds it for
    a moment); an older one is a killed process's and is removed, saying so. Torch's loader
    would wait on it forever, silently."""
    said, start = False, time.monotonic()
    while held := [(lock, age) for lock in locks if (age := lock_age(lock)) is not None]:
        for lock, age in held:
            if age > stale_s:
                lock.unlink(missing_ok=True)
                log(f"removed a stale DeepSpeed op build lock {lock} ({age:.0f} s old)")
        waiting = [(lock, age) for lock, age in held if age <= stale_s]
        if waiting and not said and time.monotonic() - start >= quiet_s:
            lock, age = waiting[0]
            log(f"waiting for a DeepSpeed op build (lock {lock}, taken {age:.0f} s ago; "
                f"one older than {stale_s:.0f} s is removed as a killed build's)")  # fmt: skip
            said = True
        time.sleep(poll_s)


def remember_cpu_info() -> None:
    """py-cpuinfo's answer, asked once per machine. DeepSpeed's CPU op builders ask it for the
    CPU's architecture and SIMD flags (their compile flags, wanted for an op already built too)
    at each op load, and py-cpuinfo answers every call from a new Python interpreter: ~1.2 s of
    CPU each on a 2-core AMD EPYC, twice per process, before the ranks can start. The answer is
    kept in the machine cache (trainer/machine_cache.py) under the CPU's model name and flags as
    /proc/cpuinfo gives them: a machine whose CPU shows other flags asks again."""
    import cpuinfo

    if hasattr(cpuinfo.get_cpu_info, "cache_info"):
        return
    ask = cpuinfo.get_cpu_info

    @functools.cache
    def answer() -> dict[str, Any]:
        key = cpu_info_key()
        if key is None:
            return ask()
        from trainer.machine_cache import default_cache

        return default_cache().measured(key, ask)[0]

    cpuinfo.get_cpu_info = answer


def cpu_info_key(proc_cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The machine cache's key of py-cpuinfo's answer: its version, the machine, and a digest
    of the first CPU's model name and flags (None where /proc/cpuinfo lists no flags)."""
    import platform

    import cpuinfo

    from trainer.machine_cache import cpu_digest

    digest = cpu_digest(proc_cpuinfo)
    if digest is None:
        return None
    version = ".".join(map(str, getattr(cpuinfo, "CPUINFO_VERSION", ())))
    return f"py-cpuinfo {version} | {platform.machine()} | cpu {digest}"


def build_ops(names: tuple[str, ...] = OPS) -> list[str]:
    """Build (or find already built) the ops this accelerator supports; returns lines to print."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    remember_cpu_info()

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
