"""The manifest: the one file that says what a prepared data directory contains.

``prepare`` writes it last and atomically, so its presence means every shard it lists was
complete when it was written.  Format (version 1)::

    {"version": 1, "src_lang": "en", "tgt_lang": "de", "vocab_size": 8000, "dtype": "uint16",
     "max_len": 256, "spm_sha256": "...",
     "splits": {"train": {"samples": N, "src_tokens": N, "tgt_tokens": N,
                          "cleaning": {"lines": N, "empty": N, "too_long": N, "ratio": N,
                                       "duplicate": N},
                          "shards": [{"name": "shards/train-000000.tar", "samples": N,
                                      "src_tokens": N, "tgt_tokens": N, "sha256": "...",
                                      "bytes": N, "packed": {"name": "shards/train-000000.ids",
                                      "sha256": "...", "bytes": N}}, ...]},
                "valid": {...}, "test": {...}}}

``src_tokens`` counts source ids including the final EOS; ``tgt_tokens`` counts target ids
without BOS/EOS (as stored).  A shard ``name`` ending in ``.tar.gz`` is a gzip-compressed tar
(``prepare(..., compress_shards=True)``); readers go by the name.  ``packed``, where present, is
the shard's ids in the packed store (data_pipeline/packed.py), which the training stream reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
TOKENIZER_NAME = "spm.model"  # the sentencepiece model (both languages) of a data dir


def tokenizer_path(data_dir: Path) -> Path:
    return Path(data_dir) / TOKENIZER_NAME


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to a temporary file, fsync, rename: readers see the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise ValueError(f"{path}: invalid manifest: {what}")


def plain_relative(name: str) -> bool:
    """A shard name the manifest may hold: relative, no `..`, no empty or odd parts."""
    parts = PurePosixPath(name).parts
    return (
        bool(parts)
        and not name.startswith(("/", "\\"))
        and "\\" not in name
        and all(p not in ("", ".", "..") for p in parts)
        and "\0" not in name
    )


def validate_manifest(m: Any, path: Path) -> dict:
    """Check the structure the loader relies on; one-line ``ValueError`` naming the problem."""
    _check(isinstance(m, dict), path, "top level is not an object")
    _check(m.get("version") == MANIFEST_VERSION, path, f"version {m.get('version')!r} != 1")
    for key in ("src_lang", "tgt_lang"):
        _check(isinstance(m.get(key), str), path, f"missing {key}")
    _check(isinstance(m.get("vocab_size"), int) and m["vocab_size"] > 4, path, "bad vocab_size")
    _check(m.get("dtype") in ("uint16", "uint32"), path, f"bad dtype {m.get('dtype')!r}")
    splits = m.get("splits")
    _check(isinstance(splits, dict) and bool(splits), path, "no splits")
    for name, split in splits.items():
        _check(isinstance(split, dict), path, f"split {name} is not an object")
        shards = split.get("shards")
        _check(isinstance(shards, list), path, f"split {name} has no shard list")
        for i, shard in enumerate(shards):
            ok = isinstance(shard, dict) and isinstance(shard.get("name"), str)
            ok = ok and isinstance(shard.get("samples"), int)
            _check(ok, path, f"split {name} shard {i} lacks name/samples")
            _check(
                plain_relative(shard["name"]),
                path,
                f"split {name} shard {i} name {shard['name']!r} is not a relative path inside "
                "the data directory",
            )
            packed = shard.get("packed")
            if packed is not None:
                ok = isinstance(packed, dict) and isinstance(packed.get("name"), str)
                ok = ok and isinstance(packed.get("bytes"), int)
                _check(ok and plain_relative(packed["name"]), path,
                       f"split {name} shard {i} has a bad packed entry")  # fmt: skip
        total = sum(s["samples"] for s in shards)
        _check(split.get("samples") == total, path, f"split {name} samples != sum over shards")
    return m


def read_manifest(data_dir: Path) -> dict:
    """Load and validate ``data_dir/manifest.json``.

    Raises ``FileNotFoundError`` / ``ValueError`` with one line naming the file and problem
    (missing directory, missing manifest, not JSON, wrong structure).
    """
    data_dir = Path(data_dir)
    path = data_dir / MANIFEST_NAME
    if not data_dir.is_dir():
        raise FileNotFoundError(f"{data_dir}: data directory not found (run `paperscale prepare`)")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: manifest not found (prepare did not finish?)")
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: invalid manifest: not JSON ({exc})") from None
    return validate_manifest(m, path)
