"""The raw text of a prepared split, in shard order (for BLEU against untokenised references)."""

from __future__ import annotations

import tarfile
from pathlib import Path

from data_pipeline.manifest import MANIFEST_NAME, read_manifest


def read_split_text(data_dir: Path, split: str) -> tuple[list[str], list[str]]:
    """(sources, references) of every sample of `split`, in manifest and shard order."""
    manifest = read_manifest(data_dir)
    if split not in manifest["splits"]:
        raise ValueError(f"{data_dir / MANIFEST_NAME} has no split {split!r}")
    sources: list[str] = []
    targets: list[str] = []
    for shard in manifest["splits"][split]["shards"]:
        texts: dict[str, dict[str, str]] = {}
        order: list[str] = []
        with tarfile.open(data_dir / shard["name"]) as tar:
            for member in tar:
                key, _, ext = member.name.partition(".")
                if ext not in ("src.txt", "tgt.txt"):
                    continue
                if key not in texts:
                    texts[key] = {}
                    order.append(key)
                f = tar.extractfile(member)
                assert f is not None
                texts[key][ext] = f.read().decode("utf-8")
        for key in order:
            sources.append(texts[key]["src.txt"])
            targets.append(texts[key]["tgt.txt"])
    return sources, targets
