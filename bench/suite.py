"""Every bench as one suite: the full run that writes bench/RESULTS.md (`make bench`), and the
smoke run that the test suite runs, so that a bench that breaks fails CI.

    python -m bench.suite [--smoke] [--only decode,sinks] [--list] [--import REPORT]

Each bench runs as its own subprocess (`python -m bench NAME`, under torchrun for several
ranks) in a process group of its own with a time limit; its output goes to WORK/NAME.log, its
rows to WORK/NAME.rows.json. RESULTS.md is rewritten after each bench (a run stopped half-way
keeps the tables it finished). A bench that fails (exit status, timeout, no rows) is a row
saying so and makes the suite exit 1; one this machine cannot run is a row saying why.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import registry
from bench.common import Row, json_rows, run_logged
from bench.registry import FULL_WORK, RESULTS, ROOT, Bench, by_name, print_registry


def machine_info() -> dict[str, Any]:
    """CPU model, cores, native bf16 (torch's view of the instruction set, as
    `train.precision: auto` reads it), GPU name or "none", and the software versions."""
    import torch

    from launch.cost_model.speed import cpu_model
    from trainer.precision import cpu_has_native_bf16

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 0,
        "native_bf16": bool(cpu_has_native_bf16()),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": metadata.version("deepspeed"),
    }


def describe_machine(m: Mapping[str, Any]) -> str:
    """'AMD EPYC, 2 cores, native bf16: no, GPU: none'."""
    bf16 = {True: "yes", False: "no"}.get(m["native_bf16"], "not recorded")
    return f"{m['cpu']}, {m['cores']} cores, native bf16: {bf16}, GPU: {m['gpu']}"


@dataclasses.dataclass
class Outcome:
    """One bench run: its rows, and whether it ran, failed or could not run (`reason`)."""

    name: str
    status: str  # "ok", "failed" or "not run"
    command: str  # the exact command line, environment first
    date: str  # when it ended, UTC
    size: str = "full"  # or "smoke"
    seconds: float = 0.0
    rows: list[Row] = dataclasses.field(default_factory=list)
    reason: str = ""
    log: str = ""


def with_nan(rows: list[Row]) -> list[Row]:
    """Rows as JSON held them, `null` back to NaN."""
    return [{**r, "value": math.nan if r["value"] is None else float(r["value"])} for r in rows]


def render_command(
    bench: Bench, smoke: bool, json_path: Path, work: Path
) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment additions, the command as shown: the interpreter relative to the
    repository when inside it) of one bench run."""
    python = sys.executable
    shown_python = os.path.relpath(python, ROOT) if Path(python).is_relative_to(ROOT) else python

    def fill(part: str, python: str = python) -> str:  # (not str.format: code has braces)
        for key, value in {"python": python, "json": json_path, "work": work}.items():
            part = part.replace("{" + key + "}", str(value))
        return part

    env, command = bench.env, bench.command(smoke)
    shown_env = [f"{k}={shlex.quote(fill(v, shown_python))}" for k, v in env.items()]
    shown = " ".join([*shown_env, shlex.join(fill(p, shown_python) for p in command)])
    return [fill(p) for p in command], {k: fill(v) for k, v in env.items()}, shown


def tail(path: Path, lines: int = 40) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-lines:] if path.is_file() else []


def _error_line(path: Path) -> str:
    """The last line of a log that looks like an error message (or the last line at all)."""
    text = [x.strip() for x in tail(path, 200) if x.strip() and not x.startswith("$ ")]
    errors = [x for x in text if any(k in x for k in ("rror", "FAIL", "failed", "exited"))]
    return (errors or text or [""])[-1][:300]


def run_bench(
    bench: Bench,
    smoke: bool,
    work_root: Path,
    timeout_s: float | None = None,
    base_env: Mapping[str, str] | None = None,
) -> Outcome:
    """Run one bench from the repository root and collect its rows: it fails when it exits
    non-zero, outlives its time limit, or writes no rows; the rows it wrote are kept anyway."""
    work_root.mkdir(parents=True, exist_ok=True)
    json_path, log = work_root / f"{bench.name}.rows.json", work_root / f"{bench.name}.log"
    argv, env, shown = render_command(bench, smoke, json_path, work_root / bench.name)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    out = Outcome(bench.name, "ok", shown, now, "smoke" if smoke else "full", log=str(log))
    if not smoke and (why := bench.missing()):
        out.status, out.reason = "not run", why
        return out
    json_path.unlink(missing_ok=True)
    limit = timeout_s or (bench.smoke_timeout_s if smoke else bench.timeout_s)
    start = time.perf_counter()
    log.write_text(f"$ {shown}\n")
    code = run_logged(argv, log, {**(base_env or os.environ), **env}, limit)
    if code is None:
        out.reason = f"no result within {limit:.0f} s (stopped)"
    out.seconds = time.perf_counter() - start
    out.date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    try:
        out.rows = with_nan(json.loads(json_path.read_text())) if json_path.is_file() else []
    except (ValueError, KeyError, TypeError) as exc:
        out.reason = out.reason or f"unreadable rows: {exc}"
    if code not in (0, None) and not out.reason:
        out.reason = f"exit status {code}" + (f": {e}" if (e := _error_line(log)) else "")
    if not out.reason and not out.rows:
        out.reason = "exited 0 but wrote no rows"
    out.status = "failed" if out.reason else "ok"
    return out


HEADER = """# Benchmark results

Written by `make bench` (`python -m bench.suite`, full size); not edited by hand. One table per
bench, headed by the exact command that measured it (from the repository root), the machine
and the date (UTC). A bench that failed or could not run is a row saying why. `python -m
bench.suite --only NAME` reruns one bench and replaces its table. A table older than `python
-m bench NAME` names the program that measured it then; `python -m bench NAME` is it now.
"""


def format_value(value: float) -> str:
    """A figure for a table cell: thousands grouped from 1,000 up, else 4 significant digits."""
    if not math.isfinite(value):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def details(r: Row) -> str:
    """A row's context, floats to 4 significant digits."""
    return ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in r.items()
        if k not in ("figure", "value", "unit")
    )


def render_section(o: Outcome, machine: Mapping[str, Any]) -> str:
    """One bench's section: what it measures, command, machine and date, its table."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    known = registry.REGISTRY
    about = [known[o.name].about, ""] if o.name in known else []
    ran = f"{o.seconds:.0f} s" if o.status != "not run" else "not run"
    lines = [
        f"## {o.name}", "", *about, f"Command: `{cell(o.command)}`  ",
        f"Machine: {describe_machine(machine)}; Python {machine['python']}, torch "
        f"{machine['torch']}, deepspeed {machine['deepspeed']}  ",
        f"Date: {o.date} UTC, {o.size} size, {ran}", "",
        "| figure | value | unit | details |", "|---|---:|---|---|",
    ]  # fmt: skip
    for r in o.rows:
        lines.append(f"| {cell(str(r['figure']))} | {format_value(r['value'])} | "
                     f"{cell(str(r['unit']))} | {cell(details(r))} |")  # fmt: skip
    if o.status != "ok":
        lines.append(f"| **{o.status}** | n/a |  | {cell(o.reason)} |")
    return "\n".join(lines) + "\n"


def split_sections(text: str) -> dict[str, str]:
    """The `## name` sections of an existing RESULTS.md, by name (each with its heading)."""
    chunks = text.split("\n## ")[1:]
    return {c.split("\n", 1)[0].strip(): "## " + c.rstrip("\n") + "\n" for c in chunks}


def render_results(
    outcomes: Sequence[Outcome], machine: Mapping[str, Any], previous: str = ""
) -> str:
    """RESULTS.md: the sections of `outcomes` and, from `previous`, those of the registered
    benches that did not run this time; in registry order."""
    known, new = registry.REGISTRY, {o.name: render_section(o, machine) for o in outcomes}
    sections = {**{n: s for n, s in split_sections(previous).items() if n in known}, **new}
    order = [*known, *(n for n in new if n not in known)]
    return HEADER + "".join("\n" + sections[n] for n in order if n in sections)


def write_results(path: Path, outcomes: Sequence[Outcome], machine: Mapping[str, Any]) -> None:
    """Rewrite `path` (atomically) with the sections of `outcomes`, keeping the others."""
    previous = path.read_text() if path.is_file() else ""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_results(outcomes, machine, previous))
    tmp.replace(path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="every bench at its smoke size")
    p.add_argument("--only", help="comma-separated bench names (default: all)")
    p.add_argument("--results", type=Path, help="the results file to rewrite (full runs: "
                   "default bench/RESULTS.md; smoke runs write one only when given)")  # fmt: skip
    p.add_argument("--json", type=Path, help="also write every outcome and row to this file")
    p.add_argument("--work-dir", type=Path, help=f"scratch files, logs and rows (default: "
                   f"{FULL_WORK} in full runs, a temporary one in smoke runs)")  # fmt: skip
    p.add_argument("--timeout", type=float, help="seconds per bench (default: the registry's)")
    p.add_argument("--verbose", "-v", action="store_true", help="print each bench's output")
    p.add_argument("--list", action="store_true", help="print the registry and exit")
    p.add_argument("--import", dest="import_report", type=Path, help="write the tables of a "
                   "report that --json wrote on another machine (a GPU one: tests/gpu/checks.sh) "
                   "into the results file, with that machine; runs nothing")  # fmt: skip
    return p.parse_args(argv)


def import_report(report_path: Path, results: Path) -> int:
    """The outcomes of a `--json` report, with the machine that measured them, as tables."""
    try:
        report = json.loads(report_path.read_text())
        outcomes = [Outcome(**{**o, "rows": with_nan(o["rows"])}) for o in report["benches"]]
        write_results(results, outcomes, report["machine"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"bench.suite: --import {report_path}: not a report of --json ({exc})",
              file=sys.stderr)  # fmt: skip
        return 2
    names = ", ".join(o.name for o in outcomes)
    print(f"bench.suite: wrote {names} measured on {describe_machine(report['machine'])}")
    return 0


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
    mode = "smoke" if args.smoke else "full"
    machine, outcomes = machine_info(), list[Outcome]()
    with tempfile.TemporaryDirectory(prefix="paperscale-bench-") as tmp:
        work = args.work_dir or (Path(tmp) if args.smoke else FULL_WORK)
        print(f"bench.suite: {len(benches)} bench(es), {mode} size, work in {work}", flush=True)
        for bench in benches:
            o = run_bench(bench, args.smoke, work, timeout_s=args.timeout)
            outcomes.append(o)
            if args.verbose or o.status == "failed":
                print("\n".join(tail(Path(o.log), 10**6 if args.verbose else 40)), flush=True)
            figures = sum(math.isfinite(r["value"]) for r in o.rows)
            ran = f"{o.seconds:6.1f} s, {figures} figure(s)" if o.status != "not run" else ""
            print(f"{o.name:<18} {o.status:<8} {ran}{'; ' if ran and o.reason else ''}{o.reason}")
            if results:  # after each bench: a run stopped half-way keeps the tables it finished
                write_results(results, outcomes, machine)
    if args.json:
        benches_out = [{**dataclasses.asdict(o), "rows": json_rows(o.rows)} for o in outcomes]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"mode": mode, "machine": machine,
                                         "benches": benches_out}, indent=1) + "\n")  # fmt: skip
    failed = [o.name for o in outcomes if o.status == "failed"]
    if failed:
        print(f"bench.suite: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def command_line(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.suite`: main, with TERM (a job's time limit, `kill`) unwinding like
    Ctrl-C, so that the running bench is stopped."""

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    return main(argv)


if __name__ == "__main__":
    sys.exit(command_line())
