"""Quality per step at twice the batch: two `paperscale train` runs on the same data and machine.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.batch_scaling --work /tmp/bench-batch \\
        --data data/debian-ende [--steps 150] [--smoke] [--json PATH]

The preset at B target tokens per step and at 2B (twice the accumulation), the
peak learning rate scaled by sqrt(2) (the square-root rule for Adam: Malladi et al., "On the
SDEs and Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022), each for --steps
steps; the steps and the training seconds each needs to reach the valid nll that B ends at.
Every figure is read from the runs' own metrics.jsonl. Without --data a synthetic corpus is
prepared under --work. `--smoke`: d_model 32 on the synthetic corpus (seconds).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from bench.common import (
    SMOKE_MODEL,
    add_output_arguments,
    prepare_synthetic,
    row,
    train_run,
    write_rows,
)


def train(args: argparse.Namespace, data: Path, name: str, over: list[str]) -> list[dict]:
    """One 2-rank run; its metrics records."""
    run_dir = Path(args.work) / name
    over = [f"data.dir={data}", "train.save_every=0", *args.overrides, *over]
    return train_run(args.config, run_dir, over, log=run_dir.with_suffix(".log"))[0]


def nll(record: dict) -> float:
    return math.log(record["valid_ppl"])


def to_target(records: list[dict], target: float) -> tuple[int, float] | None:
    """(step, training seconds) of the first evaluation at or below `target` nll; a logged
    step's training seconds are its tokens over its tokens/s (evaluations left out)."""
    seconds = 0.0
    for r in records:
        if "tgt_tokens_per_s" in r:  # every step is logged
            seconds += r["tgt_tokens_per_step"] / r["tgt_tokens_per_s"]
        if "valid_ppl" in r and nll(r) <= target:
            return r["step"], seconds
    return None


def batch(args: argparse.Namespace, data: Path) -> list[Any]:
    base = [f"train.max_steps={args.steps}", "train.log_every=1", f"train.eval_every={args.every}",
            "optim.schedule=inverse_sqrt", "train.budget_minutes=0"]  # fmt: skip
    small = train(args, data, "batch-B", [*base, f"optim.lr={args.lr}",
                                          f"train.grad_accum={args.accum}"])  # fmt: skip
    big = train(args, data, "batch-2B", [*base, f"optim.lr={args.lr * math.sqrt(2):.6g}",
                                         f"train.grad_accum={2 * args.accum}"])  # fmt: skip
    target = nll([r for r in small if "valid_ppl" in r][-1])
    case = {"target_nll": round(target, 4), "steps": args.steps, "lr_B": args.lr, "ranks": 2}
    rows = []
    for name, records in (("B", small), ("2B", big)):
        hit = to_target(records, target)
        tokens = [r["tgt_tokens_per_step"] for r in records if "tgt_tokens_per_step" in r]
        per_step = sum(tokens) / len(tokens)
        print(f"{name}: {per_step:,.0f} target tokens/step, reaches nll {target:.3f} at "
              f"{hit if hit else 'never'}", flush=True)  # fmt: skip
        rows.append(row(f"{name}: target tokens per step", per_step, "tokens", **case))
        if hit:
            rows.append(row(f"{name}: steps to the target nll", hit[0], "steps", **case))
            rows.append(row(f"{name}: training seconds to the target nll", hit[1], "s", **case))
        else:
            rows.append(row(f"{name}: did not reach the target nll", 0.0, "steps", **case))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--data", help="a prepared data dir (default: a synthetic corpus)")
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("overrides", nargs="*")
    add_output_arguments(parser, "d_model 32 on a synthetic corpus, 12 steps")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.every = 12, 4
        args.overrides = [*SMOKE_MODEL, "train.bleu_samples=8", "train.budget_calibration_steps=5",
                          "optim.warmup_steps=5", *args.overrides]  # fmt: skip
    Path(args.work).mkdir(parents=True, exist_ok=True)
    data = Path(args.data) if args.data else prepare_synthetic(Path(args.work), 2000)
    write_rows(args.json, batch(args, data))


if __name__ == "__main__":
    main()
