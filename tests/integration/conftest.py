"""Shared fixtures: a small prepared data dir and a runner for the real `paperscale` CLI."""

from __future__ import annotations

import contextlib
import os
import signal
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

    The command runs in a session of its own, so that every process it starts (torchrun, the
    ranks, their loader workers) can be ended together: past the timeout each gets SIGABRT,
    which makes every Python process print its threads' tracebacks (PYTHONFAULTHANDLER), then
    SIGKILL; the test fails with the tail of what they printed. Processes left behind by a
    finished command are killed too, so none keeps a core busy for the rest of the suite.
    `env` adds to (or overrides) the test environment of cli_env()."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=cwd,
        env={**cli_env(), "PYTHONFAULTHANDLER": "1", **(env or {})},
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGABRT)
        try:
            stdout, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        _signal_group(proc.pid, signal.SIGKILL)
        pytest.fail(
            f"`paperscale {' '.join(args[:1])}` ran past {timeout:g} s; its processes' "
            f"tracebacks:\n{stdout[-2000:]}\n{stderr[-12000:]}"
        )
    _signal_group(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


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
    "logging.report=false",  # report.png: tests/integration/test_tracking.py
]
