"""Shared fixtures: a small prepared data dir and a runner for the real `paperscale` CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
            "DS_ACCELERATOR": "cpu",
            "WANDB_SILENT": "true",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def paperscale(
    *args: str,
    cwd: Path,
    timeout: float = 300,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run `python -m launch.cli ARGS` and fail the test (not hang) past `timeout` seconds.

    `env` adds to (or overrides) the test environment of cli_env()."""
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=cwd,
        env={**cli_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
    )


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic corpus prepared into shards with a real sentencepiece model."""
    base = tmp_path_factory.mktemp("synthetic")
    corpus, data = base / "corpus", base / "data"
    proc = paperscale(
        "corpus",
        "synthetic",
        str(corpus),
        "--train",
        "3000",
        "--valid",
        "64",
        "--test",
        "64",
        cwd=base,
    )
    assert proc.returncode == 0, proc.stderr
    proc = paperscale("prepare", str(corpus), str(data), "--vocab-size", "96", cwd=base)
    assert proc.returncode == 0, proc.stderr
    return data


TINY_MODEL = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.dropout=0.1",
    "data.max_tokens=512",
    "data.max_len=64",
    "data.shuffle_buffer=256",
    "optim.lr=0.003",
    "optim.warmup_steps=4",
    "logging.wandb=offline",
]
