"""Measurements made once per machine and software version, kept for every later start.

An `auto` that only a measurement can decide (bf16 on a CPU with native bf16 instructions, at
the model's shapes) is measured once, under a file lock so that processes starting together
measure once between them, and read back from then on: a run's decision never hangs on a
sub-second timing taken while something else loads the machine.

The cache is one JSON file in `$PAPERSCALE_CACHE_DIR`, else `$XDG_CACHE_HOME/paperscale`, else
`~/.cache/paperscale`. Its keys name the CPU model, a digest of its flags, torch's version and
what was measured (e.g. the shape class), so another machine or another torch measures afresh
(a home folder shared by the nodes of a cluster holds an entry per kind of CPU). Deleting the
file makes the next start measure again. It also keeps py-cpuinfo's description of the CPU
(trainer/ds/ops.py, `remember_cpu_info`), which costs a new interpreter to ask.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_ENV = "PAPERSCALE_CACHE_DIR"
CACHE_FILE = "machine.json"
LOCK_FILE = ".machine.lock"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the machine's measurements are kept (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "paperscale"


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name ('AMD EPYC 9R14', 'Intel(R) Xeon(R) Platinum 8488C', ...)."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_digest(proc_cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """16 hex digits of the first CPU's model name and flags (x86 `flags`; Arm `Features` and
    `CPU part`): virtual machines of different CPU generations often share a model name ("AMD
    EPYC") but not their instruction sets. None where /proc/cpuinfo lists no flags."""
    import hashlib

    try:
        first = proc_cpuinfo.read_text().split("\n\n", 1)[0].splitlines()
    except OSError:
        return None
    wanted = ("model name", "flags", "Features", "CPU part")
    fields = {}
    for line in first:
        name, colon, value = line.partition(":")
        if colon and name.strip() in wanted:
            fields[name.strip()] = value.strip()
    if "flags" not in fields and "Features" not in fields:
        return None
    text = "\n".join(f"{name}={value}" for name, value in sorted(fields.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def machine_key(proc_cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The part of every key that names this machine and software: CPU model, a digest of its
    flags (where /proc/cpuinfo has them) and torch."""
    import torch

    digest = cpu_digest(proc_cpuinfo)
    flags = f" | cpu {digest[:8]}" if digest else ""
    return f"{cpu_model(proc_cpuinfo)}{flags} | torch {torch.__version__}"


@dataclass(frozen=True)
class MachineCache:
    """The cache file in `root`; every read goes to the file (no copy held in memory)."""

    root: Path

    @property
    def path(self) -> Path:
        return self.root / CACHE_FILE

    def read(self) -> dict[str, Any]:
        """Every entry; an unreadable or damaged file reads as empty (it is measured again)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict[str, Any] | None:
        value = self.read().get(key)
        return value if isinstance(value, dict) else None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive lock on the cache folder, held across a measurement and its write."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK_FILE, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def put(self, key: str, value: dict[str, Any]) -> None:
        """Add or replace one entry (call under `locked()`); written atomically."""
        from trainer.run_dir import write_atomic

        data = self.read()
        data[key] = value
        write_atomic(self.path, json.dumps(data, indent=1, sort_keys=True) + "\n")

    def measured(
        self, key: str, measure: Callable[[], dict[str, Any]]
    ) -> tuple[dict[str, Any], bool]:
        """The entry at `key`, measuring and storing it first when there is none. Returns
        (entry, True when it came from the cache). A cache folder that cannot be written is
        one warning, and the measurement is used for this start alone."""
        found = self.get(key)
        if found is not None:
            return found, True
        try:
            with self.locked():
                found = self.get(key)  # measured by another process while this one waited
                if found is not None:
                    return found, True
                value = measure()
                self.put(key, value)
                return value, False
        except OSError as exc:
            print(
                f"paperscale: warning: cannot keep a measurement in {self.root} ({exc}); set "
                f"{CACHE_ENV} to a writable folder so that every start decides alike",
                file=sys.stderr,
            )
            return measure(), False


def default_cache() -> MachineCache:
    return MachineCache(cache_dir())
