"""bench/RESULTS.md: one section per bench (what it measures; command, machine and date once;
a table of its figures), rewritten in registry order, keeping the sections of benches that
did not run this time."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.machine import describe_machine
from bench.registry import Bench, find, names
from bench.runner import Outcome

HEADER = """# Benchmark results

Written by `make bench` (`python -m bench.suite`, full size); not edited by hand. One table per
bench, headed by the exact command that measured it (from the repository root), the machine
(CPU model, cores, native bf16 or not, GPU; Python, torch and DeepSpeed) and the date (UTC);
each row is one figure with its value, unit and details. A bench that failed or could not run
on the machine is a row saying why. `python -m bench.suite --only NAME` reruns one bench and
replaces its table, keeping the others. A table older than `python -m bench NAME` names the
program that measured it then (`bench/NAME.py`, `-m bench.NAME`); `python -m bench NAME` is
that bench now.
"""
TABLE_HEAD = ["| figure | value | unit | details |", "|---|---:|---|---|"]


def format_value(value: float) -> str:
    """A figure for a table cell: thousands grouped from 1,000 up, else 4 significant digits."""
    if not math.isfinite(value):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _detail(value: Any) -> str:
    """A detail's value: a float to 4 significant digits (2.916872199000011 -> 2.917)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _details(r: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{k}={_detail(v)}" for k, v in r.items() if k not in ("figure", "value", "unit")
    )


def render_section(outcome: Outcome, bench: Bench | None, machine: Mapping[str, Any]) -> str:
    """One bench's section: heading, what it measures, its command, machine and date once,
    then its table."""
    lines = [f"## {outcome.name}", ""]
    if bench is not None:
        lines += [bench.about, ""]
    ran = f"{outcome.seconds:.0f} s" if outcome.status != "not run" else "not run"
    lines += [
        f"Command: `{_cell(outcome.command)}`  ",
        f"Machine: {describe_machine(machine)}; Python {machine['python']}, torch "
        f"{machine['torch']}, deepspeed {machine['deepspeed']}  ",
        f"Date: {outcome.date} UTC, {outcome.size} size, {ran}",
        "",
        *TABLE_HEAD,
    ]
    for r in outcome.rows:
        lines.append(
            f"| {_cell(str(r['figure']))} | {format_value(r['value'])} | {_cell(str(r['unit']))} "
            f"| {_cell(_details(r))} |"
        )
    if outcome.status != "ok":
        lines.append(f"| **{outcome.status}** | n/a |  | {_cell(outcome.reason)} |")
    return "\n".join(lines) + "\n"


def split_sections(text: str) -> dict[str, str]:
    """The `## name` sections of an existing RESULTS.md, by name (each with its heading)."""
    sections: dict[str, str] = {}
    for chunk in text.split("\n## ")[1:]:
        name = chunk.split("\n", 1)[0].strip()
        sections[name] = "## " + chunk.rstrip("\n") + "\n"
    return sections


def render_results(
    outcomes: Sequence[Outcome], machine: Mapping[str, Any], previous: str = ""
) -> str:
    """RESULTS.md: the new sections of `outcomes`, and from `previous` (the file as it was)
    those of registered benches that did not run this time; in registry order."""
    new = {o.name: render_section(o, find(o.name), machine) for o in outcomes}
    old = split_sections(previous)
    order = names() + [n for n in new if find(n) is None]
    parts = [new.get(name) or old.get(name) or "" for name in order]
    return HEADER + "".join("\n" + p for p in parts if p)


def write_results(path: Path, outcomes: Sequence[Outcome], machine: Mapping[str, Any]) -> None:
    """Rewrite `path` with the sections of `outcomes`, keeping other benches' sections."""
    previous = path.read_text() if path.is_file() else ""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_results(outcomes, machine, previous))
    tmp.replace(path)


# --------------------------------------------------------------------------------------------
