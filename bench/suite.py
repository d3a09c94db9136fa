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
import dataclasses
import json
import math
import os
import platform
import re
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
FULL_WORK = Path(tempfile.gettempdir()) / "paperscale-bench"
TORCHRUN = ("{python}", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
CPU_RANKS = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
DEBIAN_CORPUS = "corpus/debian-ende"


def _always() -> str | None:
    return None


def _needs_cuda() -> str | None:
    """Why the GPU bench cannot run at full size here, or None."""
    import torch

    if torch.cuda.is_available():
        return None
    return "no CUDA device (torch.cuda.is_available() is False); `--smoke` runs its CPU path"


def _needs_debian_corpus() -> str | None:
    """Why the data bench cannot run at full size here, or None."""
    if (ROOT / DEBIAN_CORPUS / "train.en").is_file():
        return None
    return (
        f"{DEBIAN_CORPUS} is missing (`make {DEBIAN_CORPUS}/corpus.json` fetches it; "
        "`make bench` does first)"
    )


DEMO_RUN, DEMO_DATA = "runs/demo", "data/debian-ende"
FAIRSEQ_PYTHON = ".venv-fairseq/bin/python"
BY_SOURCE_CORPUS = "corpus/debian-ende-by-source"


def _needs_fairseq() -> str | None:
    """Why the fairseq comparison cannot run at full size here, or None."""
    if not (ROOT / FAIRSEQ_PYTHON).is_file():
        return f"{FAIRSEQ_PYTHON} is missing (`make fairseq-venv` installs fairseq beside torch)"
    for corpus in (DEBIAN_CORPUS, BY_SOURCE_CORPUS):
        if not (ROOT / corpus / "train.en").is_file():
            return f"{corpus} is missing (`make bench` fetches it first)"
    return None


def _needs_demo_data() -> str | None:
    """Why the preemption bench cannot run at full size here, or None."""
    if (ROOT / DEMO_DATA / "manifest.json").is_file():
        return None
    return f"{DEMO_DATA} is missing (`make demo` prepares it)"


def _needs_demo_run() -> str | None:
    """Why the serving engines bench cannot run at full size here, or None."""
    if (ROOT / DEMO_RUN / "model" / "model.json").is_file() and (
        ROOT / DEMO_DATA / "manifest.json"
    ).is_file():
        return None
    return f"{DEMO_RUN}/model or {DEMO_DATA} is missing (`make demo` trains and writes them)"


@dataclasses.dataclass(frozen=True)
class Bench:
    """One registered bench, declared once: its program and the arguments of each size.

    The full command is `run + full + both + --json {json}`, the smoke one `run + --smoke +
    smoke + both + --json {json}`; argument lists run from the repository root, `{python}` is
    this interpreter, `{json}` the rows file the suite reads, `{work}` a scratch directory of
    this bench's own. `env` is set for the run (and shown with the command). `needs` says why
    the full run cannot happen on this machine (None: it can); a smoke run is always possible.
    """

    name: str
    about: str
    run: tuple[str, ...]
    full_args: tuple[str, ...] = dataclasses.field(default=(), kw_only=True)
    smoke_args: tuple[str, ...] = dataclasses.field(default=(), kw_only=True)
    both: tuple[str, ...] = dataclasses.field(default=(), kw_only=True)
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: ONE_THREAD, kw_only=True)
    timeout_s: float = dataclasses.field(default=1800, kw_only=True)
    smoke_timeout_s: float = dataclasses.field(default=300, kw_only=True)
    needs: Callable[[], str | None] = dataclasses.field(default=_always, kw_only=True)

    @property
    def full(self) -> tuple[str, ...]:
        return (*self.run, *self.full_args, *self.both, "--json", "{json}")

    @property
    def smoke(self) -> tuple[str, ...]:
        return (*self.run, "--smoke", *self.smoke_args, *self.both, "--json", "{json}")

    def command(self, smoke: bool) -> tuple[str, ...]:
        return self.smoke if smoke else self.full


REGISTRY: tuple[Bench, ...] = (
    Bench(
        "decode",
        "Decoding sentences/s of greedy and beam 4 search, with and without the key/value cache.",
        ("{python}", "-m", "bench.decode"),
        smoke_timeout_s=120,
    ),
    Bench(
        "decode_mixed",
        "Decoding sentences/s (cache on) of a batch of varied source lengths, each sentence "
        "ending at its own maximum length.",
        ("{python}", "-m", "bench.decode", "--mixed"),
        smoke_timeout_s=120,
    ),
    Bench(
        "engines",
        "Serving engines on the demo model: sentences/s, test BLEU and outputs equal to ours, "
        "for paperscale, Transformers and CTranslate2 (fp32, int8), beam 4.",
        ("{python}", "-m", "bench.decode"),
        full_args=("--engines", "runs/demo", "--data", "data/debian-ende"),
        smoke_args=("--engines-smoke",),
        both=("--threads", "1"),
        timeout_s=3600,
        needs=_needs_demo_run,
    ),
    Bench(
        "data",
        "Data pipeline: shard bytes per sample, loader tokens/s, padding at a 4,096-token "
        "budget, prepare pairs/s and peak memory.",
        ("{python}", "-m", "bench.data"),
        full_args=("--corpus", "corpus/debian-ende"),
        both=("--work", "{work}"),
        timeout_s=3600,
        needs=_needs_debian_corpus,
    ),
    Bench(
        "sinks",
        "Training step time with wandb (offline) + TensorBoard + jsonl against jsonl alone.",
        ("{python}", "-m", "bench.sinks"),
        full_args=("--repeats", "3", "--steps", "10"),
        env=CPU_RANKS,
    ),
    Bench(
        "checkpoint",
        "Checkpoint size and save / load seconds of the base model on 2 CPU ranks, against "
        "`paperscale plan`'s estimate.",
        (*TORCHRUN, "-m", "bench.checkpoint"),
        full_args=("--config", "configs/base.yaml"),
        env=CPU_RANKS,
    ),
    Bench(
        "checkpoint_tiny",
        "Checkpoint size, save / load seconds and the background save's stall of the demo "
        "preset on 2 CPU ranks.",
        (*TORCHRUN, "-m", "bench.checkpoint"),
        full_args=("--config", "configs/tiny.yaml"),
        env=CPU_RANKS,
        timeout_s=900,
    ),
    Bench(
        "save_overhead",
        "Steps/s of `paperscale train` (tiny preset, 2 CPU ranks) with a save every 50 steps, "
        "synchronous and in the background, against no saves; and each run against its own "
        "median step.",
        ("{python}", "-m", "bench.save_overhead"),
        full_args=("--steps", "150", "--every", "50", "--repeats", "1"),
        both=("--work", "{work}"),
        env=CPU_RANKS,
        timeout_s=2400,
        smoke_timeout_s=400,
    ),
    Bench(
        "plan_calibration",
        "`paperscale plan`'s step model on this machine: one CPU rank's effective GFLOP/s and "
        "overheads per step and per micro-batch (tiny preset), and the model's error at the "
        "preset's own batch.",
        ("{python}", "-m", "bench.plan_calibration", "--out", "{work}/plan-calibration.json"),
        timeout_s=900,
        smoke_timeout_s=120,
    ),
    Bench(
        "budget_schedules",
        "The same minutes of `paperscale train` (demo preset, 2 CPU ranks) with the budget's "
        "linear decay against the paper's inverse square root: valid nll, BLEU, steps.",
        ("{python}", "-m", "bench.time_to_quality", "--study", "schedules"),
        full_args=("--data", "data/debian-ende", "--minutes", "12"),
        both=("--work", "{work}"),
        env=CPU_RANKS,
        timeout_s=2400,
        smoke_timeout_s=400,
        needs=_needs_demo_data,
    ),
    Bench(
        "batch_scaling",
        "Steps and training seconds to the same valid nll at B and 2B target tokens per step "
        "(peak lr x sqrt 2), demo preset's model on 2 CPU ranks.",
        ("{python}", "-m", "bench.time_to_quality", "--study", "batch"),
        full_args=("--data", "data/debian-ende", "--steps", "150"),
        both=("--work", "{work}"),
        env=CPU_RANKS,
        timeout_s=3600,
        smoke_timeout_s=400,
        needs=_needs_demo_data,
    ),
    Bench(
        "checkpoint_big",
        "Checkpoint size and save / load seconds of the big model on 2 CPU ranks, against "
        "`paperscale plan`'s estimate.",
        (*TORCHRUN, "-m", "bench.checkpoint"),
        full_args=("--config", "configs/big.yaml"),
        smoke_args=("train.zero_stage=1",),
        env=CPU_RANKS,
    ),
    Bench(
        "loss_memory",
        "Peak memory of the output projection and loss, forward and backward, at the base "
        "preset: logits materialised against the chunked loss.",
        ("{python}", "-m", "bench.loss_memory"),
        timeout_s=900,
    ),
    Bench(
        "preemption",
        "Seconds from SIGTERM to every process of a 2-rank run to its checkpoint and exit 75, "
        "tiny and base presets.",
        ("{python}", "-m", "bench.preemption", "--work", "{work}"),
        env=CPU_RANKS,
        needs=_needs_demo_data,
    ),
    Bench(
        "resume_drift",
        "Loss drift of a plain DeepSpeed save / load: optimizer against RNG restore, 2 CPU ranks.",
        (*TORCHRUN, "-m", "bench.resume_drift", "--dir", "{work}"),
        env=CPU_RANKS,
        timeout_s=1200,
    ),
    Bench(
        "zero_memory",
        "Measured per-rank memory of the model states under ZeRO 0-3 on 1 and 2 ranks against "
        "`paperscale plan`.",
        ("{python}", "-m", "bench.zero_memory"),
        full_args=("--config", "configs/base.yaml"),
        smoke_args=("--timeout", "300"),
        env=CPU_RANKS,
        timeout_s=3600,
        smoke_timeout_s=420,
    ),
    Bench(
        "train_overhead",
        "Tokens/s of the paperscale training step against a bare PyTorch loop, same batches and"
        " precision.",
        ("{python}", "-m", "bench.train_overhead", "--work", "{work}"),
        env=CPU_RANKS,
        timeout_s=3600,
    ),
    Bench(
        "peer_fairseq",
        "paperscale against fairseq on the demo recipe, same data, model and machine: training "
        "and validation nll, target tokens/s (shuffled and source-ordered input); the same "
        "weights and batches stepped by both; three initialisations.",
        ("{python}", "-m", "bench.peer_fairseq"),
        full_args=(
            "--fairseq-python",
            ".venv-fairseq/bin/python",
            "--corpus",
            "corpus/debian-ende",
            "--corpus",
            "corpus/debian-ende-by-source",
        ),
        both=("--work", "{work}"),
        env=CPU_RANKS,
        timeout_s=7200,
        smoke_timeout_s=420,
        needs=_needs_fairseq,
    ),
    Bench(
        "peer_fairseq_speed",
        "paperscale (fp32, and in auto's precision) against fairseq (fp32, its only CPU "
        "precision) on the demo recipe, side by side on the same shuffled corpus, model and "
        "batch: target tokens/s and their ratio, training and validation nll at 400 steps.",
        ("{python}", "-m", "bench.peer_fairseq"),
        full_args=(
            "--fairseq-python",
            ".venv-fairseq/bin/python",
            "--corpus",
            "corpus/debian-ende",
        ),
        both=("--no-controlled", "--precision", "fp32", "--precision", "auto", "--work", "{work}"),
        env=CPU_RANKS,
        timeout_s=3600,
        smoke_timeout_s=420,
        needs=_needs_fairseq,
    ),
    Bench(
        "scaling",
        "Tokens/s of `paperscale train` on 2 local CPU ranks against 1.",
        ("{python}", "-m", "bench.scaling", "--work", "{work}"),
        timeout_s=5400,
        smoke_timeout_s=420,
    ),
    Bench(
        "synthetic_task",
        "The synthetic task end to end through the CLI (corpus, prepare, train on 2 ranks, "
        "evaluate): BLEU >= 90 within 10 minutes.",
        ("{python}", "-m", "bench.synthetic_task"),
        smoke_timeout_s=420,
    ),
    Bench(
        "gpu",
        "The big model on one GPU at the paper's batch: tokens/s, MFU and peak memory, ZeRO 1 "
        "and 2, with and without torch.compile.",
        ("bash", "bench/gpu.sh"),
        env={"PYTHON": "{python}"},
        timeout_s=900,
        smoke_timeout_s=960,
        needs=_needs_cuda,
    ),
    Bench(
        "cpu_step",
        "The demo preset's step on 2 CPU ranks: target tokens/s and MFU of the defaults, of "
        "fp32, of each speed choice undone and of the code before them (84d301c), side by side;"
        " the profiler's grouped table of the defaults and of that code.",
        ("{python}", "-m", "bench.cpu_step"),
        full_args=("--data", "data/debian-ende", "--before", "84d301c"),
        both=("--work", "{work}"),
        timeout_s=3600,
        smoke_timeout_s=420,
        needs=_needs_demo_data,
    ),
    Bench(
        "attention",
        "SDPA kernels side by side: forward + backward ms of each at the demo preset's "
        "attention shapes, fp32 and (where native) bf16; the figures behind `train.attention: "
        "auto`.",
        ("{python}", "-m", "bench.attention"),
        timeout_s=1200,
        smoke_timeout_s=120,
    ),
    Bench(
        "attention_gpu",
        "SDPA kernels side by side on a GPU at the big preset's attention shapes (math, flash, "
        "memory-efficient, cuDNN and torch's own choice): the figures behind `auto` on CUDA.",
        ("{python}", "-m", "bench.attention", "--config", "configs/big.yaml"),
        timeout_s=300,
        smoke_timeout_s=120,
        needs=_needs_cuda,
    ),
)


def by_name(names: Sequence[str] | None) -> list[Bench]:
    """The registered benches called `names` (all when None), in registry order; ValueError
    naming any unknown one."""
    if not names:
        return list(REGISTRY)
    known = {b.name for b in REGISTRY}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown bench(es) {', '.join(unknown)}; known: {', '.join(known)}")
    return [b for b in REGISTRY if b.name in names]


# --------------------------------------------------------------------------------------------
# the machine


def cpu_model() -> str:
    """The CPU's model name, from lscpu, else /proc/cpuinfo, else the platform module."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.strip().startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def machine_info() -> dict[str, Any]:
    """CPU model, cores, native bf16 (torch's view of the instruction set, as
    `train.precision: auto` reads it), GPU name or "none", and the software versions."""
    import torch

    from trainer.precision import cpu_has_native_bf16

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 0,
        "native_bf16": bool(cpu_has_native_bf16()),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": _version("deepspeed"),
    }


def describe_machine(m: Mapping[str, Any]) -> str:
    """The machine in one table cell: 'AMD EPYC, 2 cores, native bf16: no, GPU: none'."""
    bf16 = {True: "yes", False: "no"}.get(m["native_bf16"], "not recorded")
    return f"{m['cpu']}, {m['cores']} cores, native bf16: {bf16}, GPU: {m['gpu']}"


# --------------------------------------------------------------------------------------------
# running one bench


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


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")


def shown_python(python: str) -> str:
    """The interpreter as the command shows it: relative to the repository when inside it."""
    path = Path(python)
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return python


def render_command(
    bench: Bench, smoke: bool, python: str, json_path: Path, work: Path
) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment additions, the command line as shown) of one bench run."""
    values = {"python": python, "json": str(json_path), "work": str(work)}
    shown_values = {**values, "python": shown_python(python)}

    def fill(part: str, with_values: Mapping[str, str]) -> str:
        for key, value in with_values.items():
            part = part.replace("{" + key + "}", value)
        return part

    argv = [fill(part, values) for part in bench.command(smoke)]
    env = {k: fill(v, values) for k, v in bench.env.items()}
    shown = [fill(part, shown_values) for part in bench.command(smoke)]
    shown_env = [f"{k}={shlex.quote(fill(v, shown_values))}" for k, v in bench.env.items()]
    return argv, env, " ".join([*shown_env, shlex.join(shown)])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _kill_tree(proc: subprocess.Popen) -> None:
    """Stop the bench's whole process group (torchrun's ranks, DataLoader workers, ...)."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _last_error_line(path: Path) -> str:
    """The last line of a log that looks like an error message (or the last line at all)."""
    lines = _tail(path, 200).splitlines()
    text = [line.strip() for line in lines if line.strip() and not line.startswith("$ ")]
    for line in reversed(text):
        if any(k in line for k in ("Error", "error", "FAIL", "failed", "exited", "lacks")):
            return line[:300]
    return text[-1][:300] if text else ""


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows a bench wrote (null values, JSON's stand-in for NaN, come back as NaN)."""
    rows = json.loads(path.read_text())
    if not isinstance(rows, list):
        raise ValueError(f"{path}: not a JSON list of rows")
    out = []
    for r in rows:
        if not isinstance(r, dict) or not {"figure", "value", "unit"} <= r.keys():
            raise ValueError(f"{path}: not a row: {r!r}")
        out.append({**r, "value": math.nan if r["value"] is None else float(r["value"])})
    return out


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
    work = work_root / bench.name
    argv, env_add, shown = render_command(bench, smoke, python, json_path, work)
    size = "smoke" if smoke else "full"
    if not smoke and (reason := bench.needs()):
        return Outcome(bench.name, "not run", shown, utc_now(), size, reason=reason)
    json_path.unlink(missing_ok=True)
    limit = bench.smoke_timeout_s if smoke else bench.timeout_s
    if timeout_s is not None:
        limit = timeout_s
    cpu0, start = _children_cpu(), time.perf_counter()
    reason = ""
    with open(log_path, "w") as log:
        log.write(f"$ {shown}\n")
        log.flush()
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**(os.environ if base_env is None else base_env), **env_add},
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
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            code = None
            reason = f"no result within {limit:.0f} s (stopped)"
        except BaseException:  # Ctrl-C or TERM to the suite: its own session would run on
            _kill_tree(proc)
            raise
        reader.join(timeout=30)
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


# --------------------------------------------------------------------------------------------
# RESULTS.md

HEADER = """# Benchmark results

Written by `make bench` (`python -m bench.suite`, full size); not edited by hand. One table per
bench, headed by the exact command that measured it (from the repository root), the machine
(CPU model, cores, native bf16 or not, GPU; Python, torch and DeepSpeed) and the date (UTC);
each row is one figure with its value, unit and details. A bench that failed or could not run
on the machine is a row saying why. `python -m bench.suite --only NAME` reruns one bench and
replaces its table, keeping the others.
"""
TABLE_HEAD = ["| figure | value | unit | details |", "|---|---:|---|---|"]
OLD_TABLE_HEAD = "| figure | value | unit | details | command | date (UTC) | machine |"


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


def compact_section(section: str) -> str:
    """A section written before tables stated their command, date and machine once (each row
    repeated them in three more cells): the same figures in today's layout."""
    lines = section.splitlines()
    if OLD_TABLE_HEAD not in lines:
        return section
    head = lines.index(OLD_TABLE_HEAD)
    rows = [line for line in lines[head + 2 :] if line.startswith("| ")]
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))] for row in rows]
    intro = [line for line in lines[:head] if line.strip()]  # heading, about, when and what
    heading, about = intro[0], intro[1:2]
    when, _, versions = (intro[2] if len(intro) > 2 else "").partition("; ")
    out = [heading, "", *about, ""] if about else [heading, ""]
    if cells and len(cells[0]) >= 7:
        where = f"{cells[0][6]}; {versions.rstrip('.')}" if versions else cells[0][6]
        out += [f"Command: {cells[0][4]}  ", f"Machine: {where}  ", f"Date: {when}", ""]
    out += TABLE_HEAD
    out += [f"| {' | '.join(c[:4])} |" for c in cells]
    return "\n".join(out) + "\n"


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
    new = {o.name: render_section(o, _bench(o.name), machine) for o in outcomes}
    old = split_sections(previous)
    order = [b.name for b in REGISTRY] + [n for n in new if _bench(n) is None]
    parts = [new.get(name) or compact_section(old.get(name) or "") for name in order]
    return HEADER + "".join("\n" + p for p in parts if p)


def _bench(name: str) -> Bench | None:
    return next((b for b in REGISTRY if b.name == name), None)


def write_results(path: Path, outcomes: Sequence[Outcome], machine: Mapping[str, Any]) -> None:
    """Rewrite `path` with the sections of `outcomes`, keeping other benches' sections."""
    previous = path.read_text() if path.is_file() else ""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_results(outcomes, machine, previous))
    tmp.replace(path)


# --------------------------------------------------------------------------------------------


def print_registry(out: TextIO = sys.stdout) -> None:
    """Each bench's name, full command and smoke command ({python}: this interpreter, {json}:
    the rows file, {work}: the bench's scratch directory)."""
    for b in REGISTRY:
        env = "".join(f"{k}={v} " for k, v in b.env.items())
        out.write(f"{b.name}\n  full:  {env}{' '.join(b.full)}\n")
        out.write(f"  smoke: {env}{' '.join(b.smoke)}\n")


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


def outcome_of(entry: Mapping[str, Any]) -> Outcome:
    """An outcome as `Outcome.as_dict` wrote it (a non-finite figure's null back to NaN)."""
    rows = [
        {**r, "value": float("nan") if r["value"] is None else r["value"]} for r in entry["rows"]
    ]
    return Outcome(**{**entry, "rows": rows})


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
                print(_tail(Path(outcome.log)), file=sys.stderr, flush=True)
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
