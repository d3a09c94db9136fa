"""`profile.enabled` on a real 2-rank run: a Chrome trace per rank that loads as JSON with the
step's events, and the grouped table of where the steps' time went."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL, paperscale
from trainer.step_time import GROUPS, REGION_BACKWARD, REGION_DATA, REGION_FORWARD

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_profiled_steps_write_traces_and_the_grouped_table(
    synthetic_data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "2",
        "--run-dir", str(run_dir), f"data.dir={synthetic_data}", *TINY_MODEL,
        "train.max_steps=6", "train.grad_accum=2", "train.eval_every=0", "train.save_every=0",
        "train.bleu_samples=4", "logging.wandb=disabled", "logging.tensorboard=false",
        "profile.enabled=true", "profile.wait_steps=1", "profile.warmup_steps=1",
        "profile.steps=2",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = run_dir / "profile" / "step_00000003-00000004"
    assert sorted(p.name for p in out.iterdir()) == [
        "rank_00000.groups.json", "rank_00000.trace.json",
        "rank_00001.groups.json", "rank_00001.trace.json", "table.txt",
    ]  # fmt: skip
    for rank in (0, 1):
        trace = json.loads((out / f"rank_{rank:05d}.trace.json").read_text())
        names = {e.get("name", "") for e in trace["traceEvents"]}
        assert {"ProfilerStep#3", "ProfilerStep#4"} <= names  # the profiler counts from 1
        assert {REGION_DATA, REGION_FORWARD, REGION_BACKWARD} <= names
        assert "ProfilerStep#2" not in names  # the warm-up step is not in the trace
        groups = json.loads((out / f"rank_{rank:05d}.groups.json").read_text())
        assert groups["rank"] == rank and groups["steps"] == 2
        assert list(groups["groups_ms"]) == list(GROUPS)
        assert sum(groups["groups_ms"].values()) == pytest.approx(groups["step_ms"], rel=1e-6)
        assert groups["groups_ms"]["matmul"] > 0 and groups["groups_ms"]["optimizer"] > 0
        assert groups["groups_ms"]["communication"] > 0  # the step's all-reduce at least
    table = (out / "table.txt").read_text()
    assert table.startswith("where a step's time went: steps 3-4 (2 after 1 warm-up), ")
    assert "2 ranks x 2 micro-batches" in table and "rank 1" in table
    assert table in proc.stdout  # rank 0 printed it
