"""Shared fixtures: a small prepared data dir and a runner for the real `paperscale` CLI."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            # the repository first, then what the caller's path holds (e.g. a GPU image's wheels)
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
            "OMP_NUM_THREADS": "1",
            "DS_ACCELERATOR": "cpu",
            "WANDB_SILENT": "true",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def paperscale(
    *args: str,
    cwd: Path,
    timeout: float = 300,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run `python -m launch.cli ARGS` and fail the test (not hang) past `timeout` seconds.

    Every process the command starts (torchrun, the ranks in their own sessions, their loader
    workers) carries a token of this call in its environment, so that all can be ended
    together: past the timeout each gets SIGABRT, which makes every Python process print its
    threads' tracebacks (PYTHONFAULTHANDLER), then SIGKILL; the test fails with the tail of
    what they printed. Processes left behind by a finished command are killed too, so none
    keeps a core busy (or the command's output pipe open) for the rest of the suite.
    `env` adds to (or overrides) the test environment of cli_env()."""
    token = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=cwd,
        env={**cli_env(), "PYTHONFAULTHANDLER": "1", RUN_TOKEN: token, **(env or {})},
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        signal_run(proc.pid, token, signal.SIGABRT)
        try:
            stdout, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            signal_run(proc.pid, token, signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=60)
        signal_run(proc.pid, token, signal.SIGKILL)
        pytest.fail(
            f"`paperscale {' '.join(args[:1])}` ran past {timeout:g} s; its processes' "
            f"tracebacks:\n{stdout[-2000:]}\n{stderr[-12000:]}"
        )
    signal_run(proc.pid, token, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


RUN_TOKEN = "PAPERSCALE_TEST_RUN"


def logged_losses(run_dir: Path) -> list[float]:
    """Every logged training loss of RUN/metrics.jsonl, in order."""
    import json

    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r.get("loss") is not None]


def decided(run_dir: Path) -> dict[str, str]:
    """Every `auto` as the run decided it (RUN/decisions.json): key -> value."""
    import json

    record = json.loads((run_dir / "decisions.json").read_text())
    return {k: d["value"] for k, d in record["decisions"].items()}


def assert_same_decisions(run_dir: Path, reference: Path) -> None:
    """Two runs whose losses are compared step for step resolved every `auto` alike; when they
    did not, the failure names each key that differs (not a loss at some step)."""
    mine, theirs = decided(run_dir), decided(reference)
    differ = {
        k: (mine.get(k), theirs.get(k)) for k in sorted(mine.keys() | theirs.keys())
        if mine.get(k) != theirs.get(k)
    }  # fmt: skip
    assert not differ, f"the runs decided differently (this run, the reference): {differ}"


def signal_run(pgid: int, token: str, sig: int) -> None:
    """`sig` to the command's process group and to every process whose environment holds
    RUN_TOKEN=token: torchrun starts each rank in a session of its own, out of the group's
    reach, and a rank's loader workers follow it there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    marker = f"{RUN_TOKEN}={token}".encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes().split(b"\0"):
                os.kill(int(environ.parent.name), sig)
        except (OSError, ValueError):
            continue  # gone, or not ours to read


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic corpus prepared into shards with a real sentencepiece model."""
    base = tmp_path_factory.mktemp("synthetic")
    corpus, data = base / "corpus", base / "data"
    proc = paperscale(
        "corpus",
        "synthetic",
        str(corpus),
        "--train",
        "3000",
        "--valid",
        "64",
        "--test",
        "64",
        cwd=base,
    )
    assert proc.returncode == 0, proc.stderr
    proc = paperscale("prepare", str(corpus), str(data), "--vocab-size", "96", cwd=base)
    assert proc.returncode == 0, proc.stderr
    return data


WORKERS = "data.num_workers=1"  # one loader worker per rank, as the presets run
TINY_MODEL = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.dropout=0.1",
    "data.max_tokens=512",
    "data.max_len=64",
    "data.shuffle_buffer=256",
    # The loader in the rank: a loader worker costs each rank start a fork server (an interpreter
    # that imports torch, ~3 s of CPU, a third of a 10-step run's). The batches are the same
    # (tests/data_pipeline/test_golden_order.py); runs whose subject is the processes (signals,
    # kills, preemption, resharding) add WORKERS.
    "data.num_workers=0",
    "optim.lr=0.003",
    "optim.warmup_steps=4",
    # The sinks cost a rank start ~2.5 s of CPU (wandb's import and service, TensorBoard's
    # import); the tests whose subject they are turn them on (TRACKED).
    "logging.wandb=disabled",
    "logging.tensorboard=false",
    "logging.report=false",  # report.png: tests/integration/test_tracking.py
]
TRACKED = ["logging.wandb=offline", "logging.tensorboard=true"]


def compiled_in_fresh_python(call: str, timeout: float = 540) -> object:
    """`call` (an expression over `module:function` imported as `from module import function`,
    e.g. "tests.launch.test_plan:saved_and_predicted(64, compiled=True)") evaluated in a fresh
    interpreter, its JSON result returned: a crash of compiled code fails the calling test and
    not the pytest worker, and the compiler's counters start at zero. Inductor compiles on one
    thread (the suite's workers share 2 cores)."""
    import json

    target, args = call.split("(", 1)
    module, function = target.split(":")
    code = f"import json; from {module} import {function}; print(json.dumps({function}({args}))"
    env = {**cli_env(), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])
