"""What the benches share: rows, goals, the smoke-size model, a bench's own engine, running the
project's commands, and a case in a process of its own.

A row is one figure: ``{"figure": name, "value": number, "unit": str, ...context}``, where the
context keys (a ZeRO stage, a world size) say which case it measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import operator
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]

# a model for seconds of a smoke run on one core: the presets' layers and code path
SMOKE_MODEL = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
]
# a study's runs at smoke size read their batches in the rank: no loader worker and so no fork
# server per rank start (an interpreter that imports torch); the batches are the same
SMOKE_READER = "data.num_workers=0"


def row(figure: str, value: float, unit: str, **context: Any) -> Row:
    """One figure of a bench; `context` names the case it measured (JSON-serialisable)."""
    return {"figure": figure, "value": float(value), "unit": unit, **context}


def json_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows as JSON takes them (NaN as null); ValueError naming one that is no row."""
    for r in rows:
        if not isinstance(r.get("figure"), str) or not isinstance(r.get("unit"), str):
            raise ValueError(f"a row needs a str figure and unit: {r!r}")
        if not isinstance(r.get("value"), (int, float)) or isinstance(r.get("value"), bool):
            raise ValueError(f"a row needs a number value: {r!r}")
    return [{**r, "value": r["value"] if math.isfinite(r["value"]) else None} for r in rows]


GOALS = {">=": operator.ge, "<=": operator.le}


class BenchInputError(ValueError):
    """Bad input to a bench: one line and exit 2, before it runs."""


def missed_goals(rows: Sequence[Row]) -> list[str]:
    """The rows whose `goal` ("<= 1.05", ">= 90") their value misses."""
    missed = []
    for r in rows:
        if "goal" in r:
            op, bound = r["goal"].split()
            if not GOALS[op](r["value"], float(bound)):
                missed.append(f"{r['figure']} {r['value']:.4g} (goal {r['goal']})")
    return missed


def write_rows(path: str | os.PathLike[str] | None, rows: Sequence[Row]) -> None:
    """Write `rows` to `path` (if any) as JSON, atomically."""
    if path is None:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(json_rows(rows), indent=1) + "\n")
    tmp.replace(target)


def open_job(
    config: str, overrides: Sequence[str], device: str = "cpu", settle: bool = True
) -> tuple[Any, Any, Any]:
    """(job, distributed env, model config at the data's vocabulary) of a bench that builds its
    own engine; with `settle`, `train.precision` settled as a training run settles it (`auto`
    -> bf16 / fp16 / fp32), which the DeepSpeed config and the planner need."""
    from launch.config import load_config
    from model.config import ModelConfig
    from trainer.dist import init_distributed
    from trainer.settle import agree_on_precision

    job = load_config(config, [f"train.device={device}", *overrides])
    env = init_distributed(device)
    vocab = job.model.vocab_size or job.data.vocab_size
    model_cfg = ModelConfig(**{**job.model.__dict__, "vocab_size": vocab})
    precision = agree_on_precision(job, env, model_cfg).precision if settle else None
    if precision and precision != job.train.precision:
        job = dataclasses.replace(job, train=dataclasses.replace(job.train, precision=precision))
    return job, env, model_cfg


ROOT = Path(__file__).resolve().parents[1]
# CPU ranks of a multi-process bench: one thread each, DeepSpeed's CPU accelerator
CPU_ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "WANDB_SILENT": "true"}
# `paperscale` as the benches run it: this interpreter, the checkout's CLI
CLI = (sys.executable, "-m", "launch.cli")
# a training run that writes only metrics.jsonl (and its summary) besides checkpoints
QUIET_SINKS = ("logging.wandb=disabled", "logging.tensorboard=false", "logging.report=false")


@contextlib.contextmanager
def busy_processes(count: int = 4) -> Iterator[list[int]]:
    """`count` Python processes spinning on the cores until the block ends (each ended by its
    pid): the load under which a bench or a test shows what holds on a busy machine."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)


def kill_group(proc: subprocess.Popen) -> None:
    """Stop a process group (torchrun's ranks, loader workers): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=10.0)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run_logged(
    argv: Sequence[str], log: Path, env: Mapping[str, str], timeout: float, cwd: Path = ROOT
) -> int | None:
    """Run `argv` in a process group of its own, its output appended to `log`: its exit status,
    or None past `timeout` seconds. Then, or when this process is stopped (Ctrl-C, TERM), the
    whole group is stopped."""
    with open(log, "a") as f:
        proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return None
        except BaseException:
            kill_group(proc)
            raise


def run_command(
    cmd: Sequence[str],
    log: Path | None = None,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 3600.0,
    cwd: Path = ROOT,
) -> float:
    """Run `cmd` in `cwd` (first on PYTHONPATH), this environment changed by `env` (None removes
    a variable), its output to `log`: its wall seconds. A non-zero exit or the timeout ends the
    bench with the tail of its output."""
    full_env = {**os.environ, "PYTHONPATH": str(cwd)}
    for name, value in (env or {}).items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    out = log or Path(tempfile.mkstemp(prefix="bench-run-", suffix=".log")[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    started = time.perf_counter()
    code = run_logged(cmd, out, full_env, timeout, cwd)
    seconds = time.perf_counter() - started
    tail = out.read_text(errors="replace")[-3000:]
    if log is None:
        out.unlink()
    shown = " ".join(str(c) for c in cmd[2:6])
    if code is None:
        raise SystemExit(f"{tail}\n{shown} ...: no result within {timeout:.0f} s")
    if code != 0:
        raise SystemExit(f"{tail}\n{shown} ... exited {code}")
    return seconds


def in_fresh_process(
    target: str,
    kwargs: Mapping[str, Any],
    log: Path,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 3600.0,
    ranks: int = 0,
) -> Any:
    """`target` ("module:function" in bench/) called with `kwargs` in a Python process of its
    own (under torchrun on `ranks` local ranks when given), so that nothing of this process or
    of an earlier case counts in its figures: what it returned (rank 0's), through JSON; its
    output in `log`."""
    out = log.with_suffix(".result.json")
    out.unlink(missing_ok=True)
    spec = json.dumps({"target": target, "kwargs": dict(kwargs), "out": str(out)})
    python = [sys.executable, "-c", "from bench.common import _child; _child()", spec]
    if ranks:
        python = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                  f"--nproc_per_node={ranks}", "--no-python", *python]  # fmt: skip
    run_command(python, log, env, timeout)
    return json.loads(out.read_text())


def bench_function(target: str) -> Callable[..., Any]:
    """The function a "module:function" target names in bench/."""
    import importlib

    module, _, function = target.partition(":")
    return getattr(importlib.import_module(f"bench.{module}"), function)


def _child() -> None:
    """In the fresh process of `in_fresh_process`: call the target, rank 0 writes its result."""
    spec = json.loads(sys.argv[-1])
    result = bench_function(spec["target"])(**spec["kwargs"])
    if int(os.environ.get("RANK", "0")) == 0:
        Path(spec["out"]).write_text(json.dumps(result))


def train_run(
    config: str | Path,
    run_dir: Path,
    overrides: Sequence[str],
    nproc: int = 2,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 3600.0,
    log: Path | None = None,
    cwd: Path = ROOT,
) -> tuple[list[dict[str, Any]], float]:
    """A new `paperscale train` run (`run_dir` removed first) of `config` on `nproc` local
    ranks, metrics.jsonl its only sink: its metric records and wall seconds."""
    from trainer.metrics import read_metrics
    from trainer.run_dir import RunDir

    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        *CLI, "train", "--config", str(config),
        "--nproc", str(nproc), "--run-dir", str(run_dir), *QUIET_SINKS, *overrides,
    ]  # fmt: skip
    seconds = run_command(cmd, log, {**CPU_ENV, **(env or {})}, timeout, cwd)
    return read_metrics(RunDir(run_dir).metrics), seconds


def prepare_synthetic(
    work: Path,
    pairs: int = 20000,
    corpus_args: Sequence[str] = (),
    prepare_args: Sequence[str] = ("--vocab-size", "300"),
) -> Path:
    """`paperscale corpus synthetic` of `pairs` pairs, prepared, under `work` (reused)."""
    base = work / "-".join(["synthetic", str(pairs), *(a.strip("-") for a in corpus_args)])
    data = base / "data"
    if not (data / "manifest.json").is_file():
        corpus = base / "corpus"
        run_command([*CLI, "corpus", "synthetic", str(corpus), "--train", str(pairs), *corpus_args])
        run_command([*CLI, "prepare", str(corpus), str(data), *prepare_args])
    return data
