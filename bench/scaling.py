"""Tokens/s of `paperscale train` on 2 local ranks against 1, on this machine.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.scaling --work /tmp/bench-scaling \\
        [--data DATA_DIR] [--config configs/tiny.yaml] [--steps 40] [--repeats 2] [key=value ...]

Short real runs (`paperscale train --nproc N`, torchrun underneath, DeepSpeed on CPU ranks
with gloo), alternating 1, 2, 1, 2, ... so that the machine's load drifts equally on both.
Each rank takes the config's micro-batches, so 2 ranks process twice the tokens per step; the
figure is tokens/s (source + target, all ranks) from each run's metrics.jsonl, averaged over
the log steps after the first (the first includes start-up), and the ratio 2-rank / 1-rank
(2.0 = linear). Without --data a synthetic corpus is prepared under --work first.

`--smoke`: 2,000 synthetic pairs, d_model 32, one 1-rank and one 2-rank run of 4 steps logged
every 2 (seconds of training, most of the time is start-up); `--json PATH` writes both tokens/s
and the ratio as rows for bench/suite.py.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bench.common import SMOKE_MODEL, add_output_arguments, row, train_run, write_rows
from bench.train_overhead import prepare_synthetic


def run_tokens_per_s(
    nproc: int, run_dir: Path, args: argparse.Namespace, data: Path, timeout: float
) -> float:
    """One fresh training run; mean tokens/s of its log steps after the first."""
    over = [
        f"data.dir={data}", f"train.max_steps={args.steps}", f"train.log_every={args.log_every}",
        "train.eval_every=0", "train.save_every=0", "train.bleu_every=0",
        "train.eval_max_batches=1", "train.bleu_samples=8", *args.overrides,
    ]  # fmt: skip
    log = run_dir.with_suffix(".log")
    rows, _ = train_run(args.config, run_dir, over, nproc=nproc, timeout=timeout, log=log)
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]
    if not speeds:
        raise SystemExit(f"{nproc} ranks: fewer than two logged steps; raise --steps")
    return sum(speeds) / len(speeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--data", help="a prepared data dir (default: synthetic under --work)")
    parser.add_argument("--work", default="/tmp/bench-scaling")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("overrides", nargs="*")
    add_output_arguments(parser, "2,000 pairs, d_model 32, 1 repeat of 4 steps logged every 2")
    args = parser.parse_args()
    pairs = 20000
    if args.smoke:
        pairs, args.steps, args.log_every, args.repeats = 2000, 4, 2, 1
        args.overrides = [*SMOKE_MODEL, *args.overrides]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = Path(args.data) if args.data else prepare_synthetic(work, pairs)
    speeds: dict[int, list[float]] = {1: [], 2: []}
    for repeat in range(args.repeats):
        for nproc in (1, 2):
            tps = run_tokens_per_s(nproc, work / f"run{nproc}", args, data, args.timeout)
            speeds[nproc].append(tps)
            print(f"repeat {repeat}: {nproc} rank(s) {tps:9.0f} tokens/s", flush=True)
    one, two = (sum(v) / len(v) for v in (speeds[1], speeds[2]))
    print(f"config {args.config} {' '.join(args.overrides)}".rstrip())
    print(f"1 rank    {one:9.0f} tokens/s")
    print(f"2 ranks   {two:9.0f} tokens/s")
    print(f"ratio     {two / one:9.2f}  (2 ranks / 1 rank; 2.0 = linear, {os.cpu_count()} cores)")
    case = {"config": args.config, "steps": args.steps, "repeats": args.repeats}
    write_rows(
        args.json,
        [
            row("1 rank", one, "tokens/s", **case),
            row("2 ranks", two, "tokens/s", **case),
            row("ratio 2 ranks / 1 rank (2.0 = linear)", two / one, "x", **case),
        ],
    )


if __name__ == "__main__":
    main()
