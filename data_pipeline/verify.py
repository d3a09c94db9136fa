"""`verify`: every shard of a prepared data dir against its size and sha256."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_pipeline.manifest import read_manifest
from data_pipeline.shards import sha256_file


def verify(data_dir: Path, log: Callable[[str], Any] = print) -> list[str]:
    """Check every shard of ``data_dir``'s manifest against its size and sha256.

    Returns the names of missing or damaged shards (empty: all good), logging one line each.
    The loader does not hash shards (too slow per epoch); run this after copying a data
    directory, or let ``prepare`` re-run, which redoes exactly those shards.
    """
    data_dir = Path(data_dir)
    bad: list[str] = []
    for split in read_manifest(data_dir)["splits"].values():
        for shard in split["shards"]:
            path = data_dir / shard["name"]
            if not path.is_file():
                problem = "missing"
            elif path.stat().st_size != shard["bytes"]:
                problem = f"{path.stat().st_size} bytes, manifest says {shard['bytes']}"
            elif sha256_file(path) != shard["sha256"]:
                problem = "sha256 mismatch"
            else:
                continue
            bad.append(shard["name"])
            log(f"verify: {path}: {problem}")
    return bad
