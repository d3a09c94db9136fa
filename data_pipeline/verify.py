"""`verify`: every shard of a prepared data dir, and its packed ids, against size and sha256."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_pipeline.manifest import read_manifest
from data_pipeline.shards import sha256_file


def verify(data_dir: Path, log: Callable[[str], Any] = print) -> list[str]:
    """Check every shard of ``data_dir``'s manifest, and its packed ids, against their size and
    sha256.

    Returns the names of missing or damaged shards (empty: all good), logging one line each.
    The loader does not hash shards (too slow per epoch); run this after copying a data
    directory, or let ``prepare`` re-run, which redoes exactly those shards.
    """
    data_dir = Path(data_dir)
    bad: list[str] = []
    for split in read_manifest(data_dir)["splits"].values():
        for shard in split["shards"]:
            for entry in (shard, shard.get("packed")):
                problem = entry and file_problem(data_dir / entry["name"], entry)
                if problem:
                    bad.append(entry["name"])
                    log(f"verify: {data_dir / entry['name']}: {problem}")
    return bad


def file_problem(path: Path, entry: dict[str, Any]) -> str | None:
    """What is wrong with a file against its manifest entry (``bytes``, ``sha256``), or None."""
    if not path.is_file():
        return "missing"
    if path.stat().st_size != entry["bytes"]:
        return f"{path.stat().st_size} bytes, manifest says {entry['bytes']}"
    if sha256_file(path) != entry["sha256"]:
        return "sha256 mismatch"
    return None
