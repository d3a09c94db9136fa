"""Running one registered bench: its command rendered, a subprocess in its own process group
from the repository root with a timeout, its output to a log, and its rows read back into an
Outcome (ok, failed with the reason, or not run with why)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from bench.registry import ROOT, Bench


def with_nan(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as JSON held them, a null value (JSON's stand-in for NaN) back to NaN."""
    return [{**r, "value": math.nan if r["value"] is None else float(r["value"])} for r in rows]


@dataclasses.dataclass
class Outcome:
    """What one bench run gave: its rows, and whether it ran, failed or could not run."""

    name: str
    status: str  # "ok", "failed" or "not run"
    command: str  # the exact command line, environment first
    date: str  # when it ended, UTC
    size: str = "full"  # or "smoke"
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # user + system time of the bench's process tree
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    reason: str = ""  # why it failed or did not run
    log: str = ""

    def as_dict(self) -> dict[str, Any]:
        """As JSON takes it: a non-finite value becomes null."""
        out = dataclasses.asdict(self)
        out["rows"] = [
            {**r, "value": r["value"] if math.isfinite(r["value"]) else None} for r in self.rows
        ]
        return out


def outcome_of(entry: Mapping[str, Any]) -> Outcome:
    """An outcome as `Outcome.as_dict` wrote it."""
    return Outcome(**{**entry, "rows": with_nan(entry["rows"])})


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")


def render_command(
    bench: Bench, smoke: bool, python: str, json_path: Path, work: Path
) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment additions, the command line as shown: the interpreter relative to
    the repository when inside it) of one bench run."""
    values = {"python": python, "json": str(json_path), "work": str(work)}
    shown_python = os.path.relpath(python, ROOT) if Path(python).is_relative_to(ROOT) else python

    def fill(part: str, python: str = python) -> str:
        for key, value in {**values, "python": python}.items():
            part = part.replace("{" + key + "}", value)
        return part

    command = bench.command(smoke)
    env = {k: fill(v) for k, v in bench.env.items()}
    shown_env = [f"{k}={shlex.quote(fill(v, shown_python))}" for k, v in bench.env.items()]
    shown = " ".join([*shown_env, shlex.join(fill(p, shown_python) for p in command)])
    return [fill(part) for part in command], env, shown


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _kill_tree(proc: subprocess.Popen) -> None:
    """Stop the bench's whole process group (torchrun's ranks, DataLoader workers, ...)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=10.0)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _last_error_line(path: Path) -> str:
    """The last line of a log that looks like an error message (or the last line at all)."""
    lines = tail(path, 200).splitlines()
    text = [line.strip() for line in lines if line.strip() and not line.startswith("$ ")]
    for line in reversed(text):
        if any(k in line for k in ("Error", "error", "FAIL", "failed", "exited", "lacks")):
            return line[:300]
    return text[-1][:300] if text else ""


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows a bench wrote; ValueError when the file holds something else."""
    rows = json.loads(path.read_text())
    if not isinstance(rows, list):
        raise ValueError(f"{path}: not a JSON list of rows")
    for r in rows:
        if not isinstance(r, dict) or not {"figure", "value", "unit"} <= r.keys():
            raise ValueError(f"{path}: not a row: {r!r}")
    return with_nan(rows)


def run_bench(
    bench: Bench,
    smoke: bool,
    work_root: Path,
    python: str = sys.executable,
    timeout_s: float | None = None,
    echo: TextIO | None = None,
    base_env: Mapping[str, str] | None = None,
) -> Outcome:
    """Run one bench as a subprocess from the repository root and collect its rows.

    Its environment is `base_env` (default: this process's) plus the bench's own; its output
    goes to WORK_ROOT/NAME.log (and to `echo` as it comes), its rows to WORK_ROOT/NAME.rows.json.
    The run fails when it exits non-zero, outlives its timeout, or writes no rows; the rows it
    did write are kept either way.
    """
    work_root.mkdir(parents=True, exist_ok=True)
    json_path = work_root / f"{bench.name}.rows.json"
    log_path = work_root / f"{bench.name}.log"
    argv, env_add, shown = render_command(bench, smoke, python, json_path, work_root / bench.name)
    size = "smoke" if smoke else "full"
    if not smoke and (reason := bench.needs()):
        return Outcome(bench.name, "not run", shown, utc_now(), size, reason=reason)
    json_path.unlink(missing_ok=True)
    limit = bench.smoke_timeout_s if smoke else bench.timeout_s
    if timeout_s is not None:
        limit = timeout_s
    cpu0, start = _children_cpu(), time.perf_counter()
    env = {**(os.environ if base_env is None else base_env), **env_add}
    code, reason = _run_logged(argv, env, shown, log_path, limit, echo)
    seconds = time.perf_counter() - start
    outcome = Outcome(
        bench.name, "ok", shown, utc_now(), size, seconds, _children_cpu() - cpu0, log=str(log_path)
    )
    try:
        if json_path.is_file():
            outcome.rows = read_rows(json_path)
    except (ValueError, OSError) as exc:
        reason = reason or f"unreadable rows: {exc}"
    if code not in (0, None) and not reason:
        reason = f"exit status {code}"
        if last := _last_error_line(log_path):
            reason += f": {last}"
    if not reason and not outcome.rows:
        reason = "exited 0 but wrote no rows"
    if reason:
        outcome.status, outcome.reason = "failed", reason
    return outcome


def _run_logged(
    argv: list[str],
    env: Mapping[str, str],
    shown: str,
    log_path: Path,
    limit: float,
    echo: TextIO | None,
) -> tuple[int | None, str]:
    """Run `argv` in its own process group with its output to `log_path` (and `echo`):
    (exit status, "") or, past `limit` seconds, (None, why) after stopping all of it."""
    with open(log_path, "w") as log:
        log.write(f"$ {shown}\n")
        log.flush()
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a timeout stops all of it
        )
        assert proc.stdout is not None
        pipe = proc.stdout

        def copy() -> None:
            for raw in iter(pipe.readline, b""):
                line = raw.decode(errors="replace")
                log.write(line)
                if echo is not None:
                    echo.write(line)
                    echo.flush()

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        try:
            return proc.wait(timeout=limit), ""
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            return None, f"no result within {limit:.0f} s (stopped)"
        except BaseException:  # Ctrl-C or TERM to the suite: its own session would run on
            _kill_tree(proc)
            raise
        finally:
            reader.join(timeout=30)
