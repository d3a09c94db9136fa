"""Fixtures shared by the CLI tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data dir that passes the launcher's checks (a manifest); nothing to train on."""
    d = tmp_path / "data"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"version": 1, "splits": {}}))
    return d
