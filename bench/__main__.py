"""One registered bench by name: `python -m bench NAME [--smoke] [--work DIR] [--json PATH]
[key=value ...]`.

Calls the bench's function with the keyword arguments of its size, `key=value` changing one
(the value read as YAML: 3, 0.5, true, [1, 2], a path); prints its rows and writes them to
`--json PATH`. Under torchrun rank 0 reports. A row with a `goal` (">= 0.90") that its value
misses makes a full-size run exit 1.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench import registry
from bench.common import BenchInputError, Row, bench_function, missed_goals, write_rows
from bench.registry import Bench
from bench.suite import details, format_value


def parse_params(pairs: Sequence[str], bench: Bench, known: set[str]) -> dict[str, Any]:
    """`key=value` pairs as keyword arguments among `known`."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in known:
            keys = sorted(known)
            raise BenchInputError(f"{bench.name} takes key=value with a key in {keys}: {pair}")
        out[key] = yaml.safe_load(value)
    return out


def print_rows(rows: Sequence[Row]) -> None:
    """The rows as a table: figure, value and unit, then the case they measured."""
    for r in rows:
        value = format_value(r["value"])
        print(f"{r['figure']:<48} {value:>10} {r['unit']:<12} {details(r)}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("name", help="a registered bench")
    p.add_argument("--smoke", action="store_true", help="its smoke size: seconds")
    p.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    p.add_argument("--json", metavar="PATH", help="also write the rows here")
    p.add_argument("params", nargs="*", metavar="key=value", help="a keyword of its function")
    args = p.parse_intermixed_args(argv)
    bench = registry.REGISTRY.get(args.name)
    if bench is None:
        print(
            f"bench: no bench {args.name!r} here; known: {', '.join(registry.REGISTRY)}",
            file=sys.stderr,
        )
        return 2
    fn = bench_function(bench.measure)
    known = set(inspect.signature(fn).parameters)
    try:
        params = {
            **(bench.smoke if args.smoke else bench.full),
            **parse_params(args.params, bench, known - {"work"}),
        }
        with tempfile.TemporaryDirectory(prefix=f"bench-{bench.name}-") as tmp:
            work = args.work or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            rows = fn(work=work, **params) if "work" in known else fn(**params)
    except BenchInputError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    print_rows(rows)
    write_rows(args.json, rows)
    missed = [] if args.smoke else missed_goals(rows)
    for line in missed:
        print(f"FAIL: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
