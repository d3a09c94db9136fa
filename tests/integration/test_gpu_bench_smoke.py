"""bench/gpu.sh --smoke: the GPU benchmark's code path on CPU at tiny size, table and all."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.integration.conftest import ROOT, cli_env


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gpu_bench_smoke_prints_four_rows() -> None:
    """ZeRO 1 and 2, each with and without torch.compile, train on CPU through the trainer's
    engine and step; the final table has one row per configuration with finite figures."""
    proc = subprocess.run(
        ["bash", "bench/gpu.sh", "--smoke"],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout.split("== bench/gpu.sh (smoke)")[-1]
    assert "zero  compile" in table
    rows = re.findall(r"^\s+([12])\s+(yes|no)\s+([\d.]+)\s+(\d+)\s", table, flags=re.M)
    assert sorted((z, c) for z, c, _, _ in rows) == [
        ("1", "no"),
        ("1", "yes"),
        ("2", "no"),
        ("2", "yes"),
    ]
    for _, _, step_s, tokens_per_s in rows:
        assert float(step_s) > 0 and int(tokens_per_s) > 0
    losses = [
        float(line.split()[-1]) for line in table.splitlines() if re.match(r"^\s+[12]\s", line)
    ]
    assert all(0 < loss < 10 for loss in losses)  # about ln(64) + smoothing at the start


def test_gpu_bench_rejects_unknown_arguments() -> None:
    proc = subprocess.run(
        ["bash", "bench/gpu.sh", "--bogus"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "bench/gpu.sh: unknown argument --bogus (use --smoke, --json PATH or --fetch-wheels)"
    ]
