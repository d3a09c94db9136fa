"""`paperscale calibrate` as a bench: the planner's step model on this machine (one CPU rank's
effective GFLOP/s, its overheads per step and per micro-batch, and the model's error at the
config's own batch). The measurement is the product's (launch/cost_model/calibrate.py); the
smoke size is d_model 32 with one layer a side, points of 64 and 256 tokens (and 64 x 2) and
the check at 256 x 2, two timed steps each."""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import SMOKE_MODEL, Row, row
from launch.cost_model.calibrate import describe
from launch.cost_model.calibrate import measure as calibrate


def measure(work: Path, config: str = "configs/tiny.yaml", smoke: bool = False) -> list[Row]:
    """The calibration (also written to WORK/plan-calibration.json) as rows."""
    size = {"tokens": [64, 256], "steps": 2, "seq_len": 16} if smoke else {}
    overrides = [*SMOKE_MODEL, "data.max_tokens=256"] if smoke else []
    cal = calibrate(config, overrides, log=lambda line: print(line, flush=True), **size)
    print(describe(cal))
    (work / "plan-calibration.json").write_text(json.dumps(cal, indent=1) + "\n")
    return [
        row("effective rate per rank", cal["flops_per_s"] / 1e9, "GFLOP/s"),
        row("overhead per step", cal["overhead_s"] * 1e3, "ms"),
        row("overhead per micro-batch", cal["overhead_micro_s"] * 1e3, "ms"),
        row("step at the config's batch", cal["check"]["step_s"], "s"),
        row("model's error at the config's batch", cal["check"]["error"] * 100, "%"),
    ]
