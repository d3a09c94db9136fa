"""`paperscale calibrate` as a bench: the planner's step model on this machine (one CPU rank's
effective GFLOP/s, its overheads per step and per micro-batch, and the model's error at the
config's own batch) as rows for bench/suite.py.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.plan_calibration [--out FILE] [--smoke] \\
        [--json PATH]

The measurement is the product's (launch/cost_model/calibrate.py) on the tiny preset; `--smoke`
shrinks the model to d_model 32 and one layer a side, the points to 64 and 256 tokens (and
64 x 2) and the check to 256 x 2, two timed steps each.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import SMOKE_MODEL, add_output_arguments, row, write_rows
from launch.cost_model.calibrate import describe, measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--out", help="also write the calibration file here")
    add_output_arguments(parser, "d_model 32, 1+1 layers, points of 64 and 256 tokens")
    args = parser.parse_args()
    size = {"tokens": [64, 256], "steps": 2, "seq_len": 16} if args.smoke else {}
    overrides = [*SMOKE_MODEL, "data.max_tokens=256"] if args.smoke else []
    cal = measure(args.config, overrides, log=lambda line: print(line, flush=True), **size)
    print(describe(cal))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(cal, indent=1) + "\n")
    write_rows(
        args.json,
        [
            row("effective rate per rank", cal["flops_per_s"] / 1e9, "GFLOP/s"),
            row("overhead per step", cal["overhead_s"] * 1e3, "ms"),
            row("overhead per micro-batch", cal["overhead_micro_s"] * 1e3, "ms"),
            row("step at the config's batch", cal["check"]["step_s"], "s"),
            row("model's error at the config's batch", cal["check"]["error"] * 100, "%"),
        ],
    )


if __name__ == "__main__":
    main()
