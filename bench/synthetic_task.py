"""The synthetic task end to end through the real CLI, timed: can the trainer learn at all?

Runs ``paperscale corpus synthetic`` (mapped reversal: 5-20 pseudo-words from a 50-word
vocabulary, target reversed and each word mapped), ``paperscale prepare``, ``paperscale train
--nproc N`` (torchrun, DeepSpeed, the preset's ZeRO stage and precision) and ``paperscale
evaluate`` on the held-out test split with beam 4 and greedy, times each stage and prints a
table: steps, train seconds, tokens/s, final valid loss, test BLEU, total seconds.

Exits 1 when test BLEU (beam 4) is below --min-bleu or the whole path took longer than
--budget seconds, so it doubles as an acceptance check:

    .venv/bin/python -m bench.synthetic_task                    # temp dir, configs/synthetic.yaml
    .venv/bin/python -m bench.synthetic_task --work /tmp/synth  # keep corpus, data and run
    .venv/bin/python -m bench.synthetic_task train.max_steps=500  # config overrides pass through
    .venv/bin/python -m bench.synthetic_task --smoke --json rows.json  # the path in seconds

`--smoke` runs the same path at a size of seconds (1,000 pairs, d_model 32, 10 steps, 20 test
sentences) with no pass mark; `--json PATH` writes the table's figures as rows for
bench/suite.py (written before the pass / fail verdict, so a miss still reports its figures).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, SMOKE_MODEL, Row, add_output_arguments, row, write_rows
from trainer.metrics import read_metrics
from trainer.run_dir import RunDir

SMOKE_TRAIN = [
    *SMOKE_MODEL,
    "train.max_steps=10",
    "train.log_every=5",
    "train.eval_every=0",
    "train.bleu_every=0",
    "train.save_every=0",
    "logging.wandb=disabled",
    "logging.tensorboard=false",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; trailing key=value arguments are passed to `paperscale train`."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", help="work dir for corpus/, data/, run/ (default: a temp dir)")
    p.add_argument("--config", default=str(ROOT / "configs/synthetic.yaml"))
    p.add_argument("--nproc", type=int, default=2, help="local ranks (default 2)")
    p.add_argument("--train", type=int, default=20000, help="training pairs (default 20000)")
    p.add_argument("--valid", type=int, default=500, help="validation pairs (default 500)")
    p.add_argument("--test", type=int, default=500, help="held-out test pairs (default 500)")
    p.add_argument("--seed", type=int, default=1, help="corpus seed (default 1)")
    p.add_argument("--min-bleu", type=float, default=90.0, help="pass mark, beam 4 (default 90)")
    p.add_argument("--budget", type=float, default=600.0, help="max total seconds (default 600)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="passed to `train`")
    add_output_arguments(p, "1,000/20/20 pairs, d_model 32, 10 steps, no pass mark")
    args = p.parse_args(argv)
    if args.smoke:
        args.train, args.valid, args.test = 1000, 20, 20
        args.min_bleu, args.budget = 0.0, float("inf")
        args.overrides = [*SMOKE_TRAIN, *args.overrides]
    return args


def cli_env() -> dict[str, str]:
    """The environment of the CLI calls: the checkout on the path, CPU accelerator if no GPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("WANDB_SILENT", "true")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def paperscale(*args: str, cwd: Path) -> tuple[str, float]:
    """Run `python -m launch.cli ARGS`; return its stdout and wall seconds, exit on failure."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        sys.exit(f"synthetic_task: `paperscale {args[0]}` failed with exit {proc.returncode}")
    return proc.stdout, seconds


def last_json(stdout: str) -> dict[str, Any]:
    """The last line of `stdout` that parses as a JSON object."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise ValueError("no JSON object in the command's output")


def train_stats(run_dir: Path) -> dict[str, Any]:
    """Steps, valid loss and mean tokens/s of a finished run, from metrics.jsonl/summary.json."""
    records = read_metrics(RunDir(run_dir).metrics)
    summary = json.loads(RunDir(run_dir).summary.read_text())
    # Mean over log windows after the first step (which includes start-up and compilation).
    rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r and r["step"] > 1]
    valid = [r for r in records if "valid_loss" in r]
    return {
        "steps": summary.get("steps", records[-1]["step"]),
        "train_loop_s": summary.get("elapsed_s"),
        "tokens_per_s": sum(rates) / len(rates) if rates else summary.get("tokens_per_s"),
        "valid_loss": valid[-1]["valid_loss"] if valid else None,
        "valid_bleu_greedy": valid[-1].get("bleu") if valid else None,
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The whole path in `work`; returns the numbers of the table."""
    corpus, data, run_dir = work / "corpus", work / "data", work / "run"
    seconds: dict[str, float] = {}
    _, seconds["corpus"] = paperscale(
        "corpus",
        "synthetic",
        str(corpus),
        "--train",
        str(args.train),
        "--valid",
        str(args.valid),
        "--test",
        str(args.test),
        "--seed",
        str(args.seed),
        cwd=work,
    )
    _, seconds["prepare"] = paperscale(
        "prepare", str(corpus), str(data), "--config", args.config, cwd=work
    )
    _, seconds["train"] = paperscale(
        "train",
        "--config",
        args.config,
        "--nproc",
        str(args.nproc),
        "--run-dir",
        str(run_dir),
        f"data.dir={data}",
        *args.overrides,
        cwd=work,
    )
    bleu: dict[str, float] = {}
    for name, beam in (("beam4", 4), ("greedy", 1)):
        eval_args = ["--data", str(data), "--split", "test", "--beam", str(beam)]
        out, seconds[f"evaluate_{name}"] = paperscale(
            "evaluate", str(run_dir), *eval_args, cwd=work
        )
        bleu[name] = float(last_json(out)["bleu"])
    return {
        **train_stats(run_dir),
        "test_sentences": args.test,
        "test_bleu_beam4": bleu["beam4"],
        "test_bleu_greedy": bleu["greedy"],
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "total_s": round(sum(seconds.values()), 1),
        "work": str(work),
    }


def result_rows(result: dict[str, Any], args: argparse.Namespace) -> list[Row]:
    """The table's figures as rows (those the run produced: a run without validation has no
    valid loss)."""
    n = result["test_sentences"]
    config = Path(args.config).resolve()
    shown = config.relative_to(ROOT) if config.is_relative_to(ROOT) else config
    case = {"config": str(shown), "nproc": args.nproc, "train_pairs": args.train}
    budget = {"budget_s": args.budget} if math.isfinite(args.budget) else {}
    figures = [
        ("steps", result["steps"], "steps", {}),
        ("train seconds (loop)", result["train_loop_s"], "s", {}),
        ("train seconds (command)", result["seconds"]["train"], "s", {}),
        ("tokens/s (src+tgt, all ranks)", result["tokens_per_s"], "tokens/s", {}),
        ("final valid loss", result["valid_loss"], "loss", {}),
        ("valid BLEU (greedy, in training)", result["valid_bleu_greedy"], "BLEU", {}),
        ("test BLEU beam 4", result["test_bleu_beam4"], "BLEU", {"sentences": n}),
        ("test BLEU greedy", result["test_bleu_greedy"], "BLEU", {"sentences": n}),
        ("total seconds", result["total_s"], "s", budget),
    ]
    return [
        row(name, value, unit, **case, **extra)
        for name, value, unit, extra in figures
        if value is not None
    ]


def print_table(result: dict[str, Any]) -> None:
    """The result as a two-column table."""

    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    s = result["seconds"]
    n = result["test_sentences"]
    rows = [
        ("steps", fmt(result["steps"], "d")),
        ("train seconds (loop)", fmt(result["train_loop_s"], ".1f")),
        ("train seconds (command)", fmt(s["train"], ".1f")),
        ("tokens/s (src+tgt, all ranks)", fmt(result["tokens_per_s"], ",.0f")),
        ("final valid loss", fmt(result["valid_loss"], ".3f")),
        ("valid BLEU (greedy, in training)", fmt(result["valid_bleu_greedy"], ".2f")),
        (f"test BLEU beam 4 ({n} sent.)", fmt(result["test_bleu_beam4"], ".2f")),
        (f"test BLEU greedy ({n} sent.)", fmt(result["test_bleu_greedy"], ".2f")),
        ("corpus + prepare seconds", fmt(s["corpus"] + s["prepare"], ".1f")),
        (
            "evaluate seconds (beam 4 + greedy)",
            fmt(s["evaluate_beam4"] + s["evaluate_greedy"], ".1f"),
        ),
        ("total seconds", fmt(result["total_s"], ".1f")),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value:>10}")


def main(argv: list[str] | None = None) -> int:
    """Run the path, print the table, return 1 if BLEU or time misses its mark."""
    args = parse_args(argv)
    if args.nproc < 1:
        sys.exit("synthetic_task: --nproc must be >= 1")
    if args.work:
        work = Path(args.work).resolve()
        if work.exists() and any(work.iterdir()):
            sys.exit(f"synthetic_task: --work {work} is not empty")
        work.mkdir(parents=True, exist_ok=True)
        result = run(args, work)
    else:
        with tempfile.TemporaryDirectory(prefix="paperscale-synthetic-") as tmp:
            result = run(args, Path(tmp))
    print_table(result)
    write_rows(args.json, result_rows(result, args))
    failures = []
    if result["test_bleu_beam4"] < args.min_bleu:
        failures.append(f"test BLEU {result['test_bleu_beam4']:.2f} < {args.min_bleu}")
    if result["total_s"] > args.budget:
        failures.append(f"total {result['total_s']:.0f} s > {args.budget:.0f} s")
    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print(f"PASS: test BLEU >= {args.min_bleu} within {args.budget:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
