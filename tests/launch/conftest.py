"""Fixtures shared by the CLI tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def plan_cli(*args: str) -> subprocess.CompletedProcess:
    """`paperscale plan ARGS` in a process of its own, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", "plan", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data dir that passes the launcher's checks (a manifest); nothing to train on."""
    d = tmp_path / "data"
    d.mkdir()
    manifest = {
        "version": 1, "src_lang": "en", "tgt_lang": "de", "vocab_size": 100, "dtype": "uint16",
        "splits": {"train": {"samples": 0, "shards": []}},
    }  # fmt: skip
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d
