"""`prepare`'s resume journal: `.prepare-progress.jsonl` in the output directory.

The first line holds the run's parameters; every later line records one finished piece (the
tokenizer, a shard) with its sha256. A re-run with identical parameters reuses the pieces whose
files still match and redoes the rest; other parameters start over. Lines are appended and
fsynced, so an interruption loses at most the line being written (a torn last line is ignored).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

PROGRESS_NAME = ".prepare-progress.jsonl"


def load_progress(out_dir: Path, params: dict) -> dict[str, dict]:
    """Records of the previous run with identical params (else start over: ``{}``)."""
    path = out_dir / PROGRESS_NAME
    records: dict[str, dict] = {}
    if not path.is_file():
        return records
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    try:
        head = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        head = None
    if head != {"kind": "params", **params}:
        return {}
    for line in lines[1:]:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break  # a torn last line from the interruption
        records[rec["id"]] = rec
    return records


def append_record(path: Path, rec: dict) -> None:
    """Append one record and fsync it."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def start_journal(path: Path, params: dict) -> None:
    """A new journal holding only the parameters line."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"kind": "params", **params}) + "\n")
