"""Looking at runs and configs: `status`, `report`, `config` (`plan` is launch/cmd_plan.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from launch.usage import UsageError
from trainer.run_dir import RunDir


def cmd_status(args: argparse.Namespace) -> int:
    from launch.status import format_status, run_status

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run dir {run_dir} does not exist")
    status = run_status(run_dir)
    print(json.dumps(status, indent=1) if args.json else format_status(status))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from trainer.report import write_report

    run_dir = Path(args.run_dir)
    if not RunDir(run_dir).metrics.is_file():
        raise UsageError(f"{run_dir} has no {RunDir(run_dir).metrics.name}")
    try:
        path, summary = write_report(run_dir, Path(args.out) if args.out else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(summary)
    print(f"report           {path}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from launch.config import load_config, to_yaml

    if args.reference:
        if args.config or args.overrides:
            raise UsageError("--reference takes no --config or overrides")
        from launch.config_reference import reference_markdown

        sys.stdout.write(reference_markdown())
        return 0
    sys.stdout.write(to_yaml(load_config(args.config, args.overrides)))
    return 0
