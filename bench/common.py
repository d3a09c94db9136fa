"""What the benches share: their key figures as JSON rows (`--json PATH`), the smoke-size
model, and the precision a training run would pick on this machine.

A row is one figure: ``{"figure": name, "value": number, "unit": str, ...context}``, where
the optional context keys (a ZeRO stage, a search, a world size) say which case it measured.
`bench/suite.py` reads these files to write bench/RESULTS.md, and the test suite checks them,
so every bench reports the same way whatever it prints for a human.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]

# A model small enough for a bench's --smoke run to take seconds on one CPU core, with the
# same layer types and code path as the presets.
SMOKE_MODEL = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
]


def row(figure: str, value: float, unit: str, **context: Any) -> Row:
    """One figure of a bench; `context` names the case it measured (JSON-serialisable)."""
    return {"figure": figure, "value": float(value), "unit": unit, **context}


def add_output_arguments(parser: argparse.ArgumentParser, smoke: str) -> None:
    """Add the two options every bench has: --smoke (described by `smoke`) and --json PATH."""
    parser.add_argument("--smoke", action="store_true", help=f"a run of seconds: {smoke}")
    parser.add_argument(
        "--json", metavar="PATH", help="also write the key figures to PATH as a JSON list of rows"
    )


def check_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows as a list, or ValueError naming the first one that is not a proper row."""
    for r in rows:
        if not isinstance(r.get("figure"), str) or not isinstance(r.get("unit"), str):
            raise ValueError(f"a row needs a str figure and unit: {r!r}")
        if not isinstance(r.get("value"), (int, float)) or isinstance(r.get("value"), bool):
            raise ValueError(f"a row needs a number value: {r!r}")
    return list(rows)


def write_rows(path: str | os.PathLike[str] | None, rows: Sequence[Row]) -> None:
    """Write `rows` to `path` as JSON (nothing when `path` is None); atomically, so a reader
    never sees half a file. Non-finite values are written as null (JSON has no NaN)."""
    if path is None:
        return
    out = [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
        for r in check_rows(rows)
    ]
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    tmp.replace(target)


def settle_precision(job: Any, env: Any, model_cfg: Any) -> Any:
    """The job with `train.precision` as a training run would settle it on this machine
    (`auto` -> bf16 / fp16 / fp32, trainer.settle.agree_on_precision, the same on every rank).

    A bench that builds its own engine must do this: the DeepSpeed config treats any value
    other than bf16/fp16 as fp32, and the checkpoint size estimate and the planner need the
    real precision.
    """
    from trainer.settle import agree_on_precision

    choice = agree_on_precision(job, env, model_cfg, None)
    if choice.precision == job.train.precision:
        return job
    return dataclasses.replace(
        job, train=dataclasses.replace(job.train, precision=choice.precision)
    )
