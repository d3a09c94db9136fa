"""Every bench in bench/ as one suite: the full run that writes bench/RESULTS.md, and the smoke
run (seconds per bench) that the test suite runs, so a bench that breaks fails CI.

    python -m bench.suite                       # full size; rewrites bench/RESULTS.md (make bench)
    python -m bench.suite --smoke               # every bench at smoke size; writes no results
    python -m bench.suite --only decode,sinks   # some benches; their tables replace the old ones
    python -m bench.suite --list                # the registry: name, full and smoke command

Each bench runs as its own subprocess (torchrun-launched ones under `torch.distributed.run`),
with a timeout, and writes its key figures to a JSON file of rows (`--json PATH`, see
bench/common.py); the suite collects them. In RESULTS.md each bench has a table, one row per
figure with its value and unit, the exact command, the date (UTC) and the machine (CPU model,
cores, native bf16 or not, GPU); the file is rewritten after each bench, so a run stopped
half-way keeps the tables it finished. A bench that fails (exit status, timeout, no rows) is a row
saying so and makes the suite exit 1; a bench that cannot run on this machine (the GPU bench
without CUDA, the data bench without its corpus) is a row saying why, and is no failure.
Each bench's output goes to WORK/NAME.log (`--verbose` also echoes it).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.machine import describe_machine, machine_info
from bench.registry import FULL_WORK, RESULTS, ROOT, by_name, print_registry
from bench.report import write_results
from bench.runner import Outcome, outcome_of, run_bench, tail


def summary_line(o: Outcome) -> str:
    finite = sum(1 for r in o.rows if math.isfinite(r["value"]))
    head = f"{o.name:<15} {o.status:<8}"
    if o.status == "not run":
        return f"{head} {o.reason}"
    text = f"{head} {o.seconds:6.1f} s (cpu {o.cpu_seconds:6.1f} s), {finite} figure(s)"
    return f"{text}; {o.reason}" if o.reason else text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="every bench at its smoke size")
    p.add_argument("--only", help="comma-separated bench names (default: all)")
    p.add_argument(
        "--results",
        type=Path,
        help=f"the results file to rewrite (full runs: default {RESULTS.relative_to(ROOT)}; "
        "smoke runs write one only when given)",
    )
    p.add_argument("--json", type=Path, help="also write every outcome and row to this file")
    p.add_argument(
        "--work-dir",
        type=Path,
        help=f"scratch files, logs and rows (default: {FULL_WORK} in full runs, a temporary "
        "directory in smoke runs)",
    )
    p.add_argument("--timeout", type=float, help="seconds per bench (default: the registry's)")
    p.add_argument("--verbose", "-v", action="store_true", help="echo each bench's output")
    p.add_argument("--list", action="store_true", help="print the registry and exit")
    p.add_argument(
        "--import",
        dest="import_report",
        type=Path,
        help="write the tables of a report that --json wrote on another machine (a GPU one: "
        "tests/gpu/checks.sh) into the results file, with that machine; runs nothing",
    )
    return p.parse_args(argv)


def import_report(report_path: Path, results: Path) -> int:
    """The outcomes of a `--json` report, with the machine that measured them, as tables."""
    try:
        report = json.loads(report_path.read_text())
        outcomes = [outcome_of(b) for b in report["benches"]]
        machine = report["machine"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(
            f"bench.suite: --import {report_path}: not a report of --json ({exc})", file=sys.stderr
        )
        return 2
    write_results(results, outcomes, machine)
    names = ", ".join(o.name for o in outcomes)
    print(f"bench.suite: wrote {names} measured on {describe_machine(machine)} to {results}")
    return 0


def _exit_on_term(signum: int, frame: object) -> None:
    """TERM (a job's time limit, `kill`) unwinds like Ctrl-C, so the running bench is stopped."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen benches; 0 when none failed, 1 when one did, 2 on a usage error."""
    args = parse_args(argv)
    if args.list:
        print_registry()
        return 0
    if args.import_report:
        return import_report(args.import_report, args.results or RESULTS)
    try:
        benches = by_name(args.only.split(",") if args.only else None)
    except ValueError as exc:
        print(f"bench.suite: {exc}", file=sys.stderr)
        return 2
    results = args.results if args.results or args.smoke else RESULTS
    with tempfile.TemporaryDirectory(prefix="paperscale-bench-") as tmp:
        work = args.work_dir or (Path(tmp) if args.smoke else FULL_WORK)
        mode = "smoke" if args.smoke else "full"
        print(f"bench.suite: {len(benches)} bench(es), {mode} size, work in {work}", flush=True)
        machine = machine_info()
        outcomes = []
        for bench in benches:
            echo = sys.stdout if args.verbose else None
            outcome = run_bench(bench, args.smoke, work, timeout_s=args.timeout, echo=echo)
            outcomes.append(outcome)
            print(summary_line(outcome), flush=True)
            if outcome.status == "failed" and not args.verbose:
                print(tail(Path(outcome.log)), file=sys.stderr, flush=True)
            if results:  # after each bench: a run stopped half-way keeps the tables it finished
                write_results(results, outcomes, machine)
                print(f"bench.suite: wrote {bench.name}'s table to {results}", flush=True)
    if args.json:
        report = {"mode": mode, "machine": machine, "benches": [o.as_dict() for o in outcomes]}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    failed = [o.name for o in outcomes if o.status == "failed"]
    if failed:
        print(f"bench.suite: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def command_line(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.suite`: main, with TERM stopping the running bench as Ctrl-C does."""
    signal.signal(signal.SIGTERM, _exit_on_term)
    return main(argv)


if __name__ == "__main__":
    sys.exit(command_line())
