"""What checkpoints cost a training run: `paperscale train` on 2 CPU ranks with no saves but
the last, a save every N steps (synchronous), and a save every N steps in the background
(train.async_save), side by side on the same data, seed and batches.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.save_overhead --work /tmp/bench-saves \\
        [--config configs/tiny.yaml] [--steps 120] [--every 40] [--repeats 1] [--smoke] \\
        [--json PATH] [key=value ...]

Each run's wall time is read from its own metrics.jsonl: from the first logged step to the
last (every step logged), so start-up and the final save are outside it and every periodic
save inside it. The figure is each variant's steps/s over the no-save run's, from the sum of
its rounds (rounds alternate the variants, so the machine's load drifts equally on all).
Runs minutes apart on a shared machine differ by more than a few saves cost, so each run is also
measured against itself: its steps' time over what its median step would give (the saves land
in a few steps; the median is the step without them); the cost of saves is that excess less
the no-save run's (its own noise), a figure independent of the load between runs.
Without --data a synthetic corpus is written and prepared under --work (bench/train_overhead.py).
`--smoke`: d_model 32, 6 steps, a save every 2 (seconds).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.common import SMOKE_MODEL, add_output_arguments, row, train_run, write_rows
from bench.train_overhead import prepare_synthetic
from trainer.run_dir import RunDir

VARIANTS = {
    "no saves": ["train.save_every=0"],
    "sync saves": ["train.async_save=false"],
    "async saves": ["train.async_save=true"],
}


def run_once(args: argparse.Namespace, data: Path, variant: str, k: int) -> list[float]:
    """Each step's wall seconds, from the first to the last logged step of one run."""
    run_dir = Path(args.work) / f"run-{k}-{variant.replace(' ', '-')}"
    over = [
        f"data.dir={data}", f"train.max_steps={args.steps}", f"train.save_every={args.every}",
        "train.log_every=1", "train.eval_every=0", "train.keep_last=2", *args.overrides,
        *VARIANTS[variant],
    ]  # fmt: skip
    records, _ = train_run(args.config, run_dir, over, log=run_dir.with_suffix(".log"))
    times = {r["step"]: r["time"] for r in records if "loss" in r}
    first, last = min(times), max(times)
    assert last == args.steps, f"{variant}: the run ended at step {last}"
    saves = RunDir(run_dir).checkpoints.complete_tags()
    print(f"{variant:12s} round {k}: {last - first} steps in {times[last] - times[first]:.1f} s; "
          f"checkpoints kept {saves}", flush=True)  # fmt: skip
    return [times[i] - times[i - 1] for i in range(first + 1, last + 1)]


def excess(steps: list[float]) -> float:
    """The steps' time over as many median steps, as a fraction of the latter; the first
    tenth left out (a run's first steps are slower, saves or not; the first save is later)."""
    steps = steps[max(len(steps) // 10, 1) :]
    typical = len(steps) * statistics.median(steps)
    return sum(steps) / typical - 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--data", help="a prepared data dir (default: a synthetic corpus)")
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    add_output_arguments(parser, "d_model 32, 6 steps, a save every 2")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.every, args.repeats = 6, 2, 1
        args.overrides = [*SMOKE_MODEL, *args.overrides]
    Path(args.work).mkdir(parents=True, exist_ok=True)
    data = (
        Path(args.data)
        if args.data
        else prepare_synthetic(Path(args.work), 2000 if args.smoke else 20000)
    )
    seconds = {v: 0.0 for v in VARIANTS}
    excesses: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for k in range(args.repeats):
        for variant in VARIANTS:
            steps = run_once(args, data, variant, k)
            seconds[variant] += sum(steps)
            excesses[variant].append(excess(steps))
    base = seconds["no saves"]
    case = {"config": args.config, "steps": args.steps, "save_every": args.every,
            "rounds": args.repeats, "ranks": 2}  # fmt: skip
    rows = [row(f"{v}: wall time of the steps", s / args.repeats, "s", **case)
            for v, s in seconds.items()]  # fmt: skip
    for variant in ("sync saves", "async saves"):
        ratio = base / seconds[variant]
        print(f"{variant}: steps/s x{ratio:.3f} of no saves", flush=True)
        rows.append(row(f"{variant}: steps/s / no saves", ratio, "x", **case))
    floor = statistics.mean(excesses["no saves"])
    rows.append(row("no saves: steps' time over median steps", 100 * floor, "%", **case))
    for variant in ("sync saves", "async saves"):
        cost = 100 * (statistics.mean(excesses[variant]) - floor)
        print(f"{variant}: in-run cost {cost:.2f} % of the steps' time", flush=True)
        rows.append(row(f"{variant}: in-run cost (excess over no saves')", cost, "%", **case))
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
