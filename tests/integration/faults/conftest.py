"""Shared pieces of the fault tests: one config, an uninterrupted reference run, log readers.

Every run here is 2 ranks of the tiny model on the synthetic data, bf16, ZeRO 2, saving every
step (so that a resumed run's losses can be compared with the reference run's, step by step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.agent import rank_start
from launch.config import load_config, to_yaml
from launch.local import child_env, torchrun_command
from tests.integration.conftest import TINY_MODEL, cli_env, paperscale

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs/tiny.yaml"
STEPS = 10  # the reference run's length
CANARY = "canary-7f3a9c1e5b"
SECRET_ENV = {
    "WANDB_API_KEY": f"wandb-{CANARY}",
    "HF_TOKEN": f"hf-{CANARY}",
    "AWS_SECRET_ACCESS_KEY": f"aws-{CANARY}",
    "DB_PASSWORD": f"db-{CANARY}",
    "MY_SERVICE_KEY": f"svc-{CANARY}",
    "SEED_SECRET": "1",  # train.seed of the reference run comes from it: the default seed
}


def overrides(data: Path, max_steps: int = STEPS, *extra: str) -> list[str]:
    return [
        f"data.dir={data}", *TINY_MODEL, "train.zero_stage=2", "train.precision=bf16",
        "train.log_every=1", "train.eval_every=0", "train.save_every=1", "train.keep_last=3",
        "train.bleu_samples=4", "train.bleu_beam=1", "logging.wandb=disabled",
        "logging.tensorboard=false", f"train.max_steps={max_steps}", *extra,
    ]  # fmt: skip


def losses(run_dir: Path) -> dict[int, float | None]:
    path = run_dir / "metrics.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {r["step"]: r.get("loss") for r in records if "loss" in r}


def resumed_steps(output: str) -> list[int]:
    """The step of every 'resumed from ... at step N' line, in order."""
    return [int(line.rsplit(" ", 1)[1]) for line in output.splitlines() if "resumed from" in line]


def fault_env(**faults: str) -> dict[str, str]:
    env = {**child_env(use_cuda=False), **cli_env()}
    env.update({f"PAPERSCALE_FAULT_{k.upper()}": v for k, v in faults.items()})
    return env


def torchrun_with_restarts(
    run_dir: Path, over: list[str], max_restarts: int, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """What `paperscale train --nproc 2` runs, plus torchrun's --max-restarts: a dead worker
    group is restarted and resumes from the latest checkpoint."""
    job = load_config(CONFIG, over)
    job.run.dir = str(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(job))
    start = rank_start(use_cuda=False)  # forked, as `paperscale train` starts CPU ranks
    config = run_dir / "config.yaml"
    cmd = torchrun_command(2, config, run_dir, max_restarts=max_restarts, start=start)
    return subprocess.run(
        cmd, cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the marks, however started
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fault tests that compare with the reference run (a session fixture) run on one
    pytest-xdist worker, one after another, so that it is trained once; the others spread."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and "reference_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("faults"))


@pytest.fixture(scope="session")
def reference_run(synthetic_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run, with wandb (offline) and TensorBoard on and secrets in its
    environment."""
    run_dir = tmp_path_factory.mktemp("faults") / "reference"
    env = {**cli_env(), **SECRET_ENV}
    args = overrides(
        synthetic_data, STEPS, "logging.wandb=offline", "logging.tensorboard=true",
        "train.seed=${oc.env:SEED_SECRET}",
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "train", "--config", str(CONFIG), "--nproc", "2",
         "--run-dir", str(run_dir), *args],
        cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir / "launcher.log").write_text(proc.stdout + proc.stderr)
    return run_dir


def wait_gone(pids: list[int], timeout: float) -> dict[int, float]:
    """Poll until every pid has exited; returns each one's exit time (time.time())."""
    gone: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(gone) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in gone and not os.path.exists(f"/proc/{pid}"):
                gone[pid] = time.time()
        time.sleep(0.05)
    return gone


__all__ = ["CONFIG", "ROOT", "STEPS", "paperscale"]
