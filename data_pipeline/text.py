"""The raw text of a prepared split, in shard order (for BLEU against untokenised references),
checked against the manifest: a score is only ever over the whole split, or says how much of it
it covers."""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_pipeline.manifest import MANIFEST_NAME, read_manifest
from data_pipeline.shards import sha256_file


class SplitDamaged(ValueError):
    """A shard of the split does not hold what the manifest says; `str()` is one line."""


@dataclass
class SplitText:
    """The pairs read from a split, and what the manifest promised."""

    sources: list[str]
    targets: list[str]
    expected: int  # sentences the manifest lists for the split
    damaged: list[str] = field(default_factory=list)  # one line per shard that failed

    @property
    def complete(self) -> bool:
        return not self.damaged and len(self.sources) == self.expected


def _read_shard(path: Path) -> tuple[list[str], list[str]]:
    """(sources, targets) of one shard's text members, in the tar's order."""
    texts: dict[str, dict[str, str]] = {}
    order: list[str] = []
    with tarfile.open(path) as tar:
        for member in tar:
            key, _, ext = member.name.partition(".")
            if ext not in ("src.txt", "tgt.txt"):
                continue
            if key not in texts:
                texts[key] = {}
                order.append(key)
            f = tar.extractfile(member)
            if f is None:
                raise tarfile.ReadError(f"member {member.name} is not a file")
            texts[key][ext] = f.read().decode("utf-8")
    pairs = [texts[k] for k in order if {"src.txt", "tgt.txt"} <= texts[k].keys()]
    return [p["src.txt"] for p in pairs], [p["tgt.txt"] for p in pairs]


def shard_problem(data_dir: Path, shard: dict[str, Any]) -> str | None:
    """Why a shard's file is not the one the manifest lists (missing, other sha256), or None."""
    path = data_dir / shard["name"]
    if not path.is_file():
        return f"{path} is missing"
    expected = shard.get("sha256")
    if expected and sha256_file(path) != expected:
        return f"{path} does not match the manifest's sha256 (changed or damaged)"
    return None


def read_split(data_dir: Path, split: str, allow_damaged: bool = False) -> SplitText:
    """Every pair of `split`, in manifest and shard order, each shard checked against the
    manifest (its sha256, then its sentence count). A damaged shard raises SplitDamaged, or
    with `allow_damaged` is read as far as it can be (or left out) and named in `damaged`."""
    manifest = read_manifest(data_dir)
    if split not in manifest["splits"]:
        raise ValueError(f"{data_dir / MANIFEST_NAME} has no split {split!r}")
    entry = manifest["splits"][split]
    out = SplitText([], [], int(entry["samples"]))
    for shard in entry["shards"]:
        problem = shard_problem(data_dir, shard)
        sources: list[str] = []
        targets: list[str] = []
        if problem is None or allow_damaged:
            try:
                sources, targets = _read_shard(data_dir / shard["name"])
            except (OSError, tarfile.TarError, EOFError, UnicodeDecodeError) as exc:
                problem = problem or f"{data_dir / shard['name']} is not readable ({exc})"
        if problem is None and len(sources) != shard["samples"]:
            problem = (
                f"{data_dir / shard['name']} holds {len(sources)} sentence pairs, the manifest "
                f"lists {shard['samples']}"
            )
        if problem is not None:
            if not allow_damaged:
                raise SplitDamaged(f"the {split} split is damaged: {problem}")
            out.damaged.append(problem)
        out.sources += sources
        out.targets += targets
    return out


def read_split_text(data_dir: Path, split: str) -> tuple[list[str], list[str]]:
    """(sources, references) of every sample of `split`; SplitDamaged when it is not whole."""
    text = read_split(data_dir, split)
    return text.sources, text.targets
