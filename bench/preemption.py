"""Seconds from SIGTERM to exit 75 of a 2-rank training run, as Slurm's preemption delivers it.

Per preset (at 1,536 tokens per micro-batch, so that a base step takes seconds on a CPU), once
`after` steps are logged, SIGTERM to the run's whole process group, as Slurm signals a job:
seconds to the new `latest` checkpoint and to the exit (75 expected), the step saved and the
checkpoint's size; against `train.stop_grace_s` (30 s, Slurm's default KillWait).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.common import CLI, CPU_ENV, QUIET_SINKS, ROOT, SMOKE_MODEL, Row, prepare_synthetic, row
from data_pipeline.manifest import read_manifest
from trainer.metrics import read_metrics
from trainer.run_dir import RunDir, tag_for

PRESETS = {"tiny": "configs/tiny.yaml", "base": "configs/base.yaml"}
START_TIMEOUT_S = 900.0  # start-up plus `after` steps of the base model on 2 CPU cores
EXIT_TIMEOUT_S = 120.0  # past Slurm's 30 s the job would have been killed; this only bounds a hang


def measure(
    work: Path,
    data: str = "data/debian-ende",
    presets: Mapping[str, str] = PRESETS,
    after: int = 3,
    overrides: Sequence[str] = (),
    smoke: bool = False,
) -> list[Row]:
    """Each preset (name: config) TERMed after `after` logged steps."""
    path = Path(ROOT, data)
    if smoke:
        path, presets = prepare_synthetic(work, 2000), {"tiny": PRESETS["tiny"]}
        overrides = [*SMOKE_MODEL, *overrides]
    if not (path / "manifest.json").is_file():
        raise SystemExit(f"data {path}: no manifest.json (paperscale prepare it first)")
    rows: list[Row] = []
    for name, config in presets.items():
        rows += preempt(name, config, path, work / name / "run", after, overrides)
    return rows


def preempt(
    name: str, config: str, data: Path, run_dir: Path, after: int, overrides: Sequence[str]
) -> list[Row]:
    """One run TERMed after `after` logged steps: its rows."""
    run = RunDir(run_dir)
    cmd = [
        *CLI, "train", "--config", config, "--nproc", "2", "--run-dir", str(run_dir),
        f"data.dir={data}",
        f"data.vocab_size={read_manifest(data)['vocab_size']}",  # a preset's own may differ
        "data.max_tokens=1536", "train.max_steps=100000", "train.log_every=1",
        "train.eval_every=0", "train.save_every=0", "train.bleu_every=0", *QUIET_SINKS, *overrides,
    ]  # fmt: skip
    shutil.rmtree(run_dir.parent, ignore_errors=True)  # a fresh run, not a resumed one
    run_dir.parent.mkdir(parents=True)
    log = run_dir.parent / f"{name}.log"
    env = {**os.environ, **CPU_ENV, "PYTHONPATH": str(ROOT)}
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while sum(r.get("loss") is not None for r in read_metrics(run.metrics)) < after:
                if proc.poll() is not None:
                    raise SystemExit(f"{name}: train exited {proc.returncode} before step {after}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: fewer than {after} steps in {START_TIMEOUT_S} s")
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGTERM)  # every process of the run, as Slurm signals a job
            sent_wall, sent = time.time(), time.monotonic()
            proc.wait(timeout=EXIT_TIMEOUT_S)
            exited = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    stopped = re.search(r"stopped at step (\d+) after a signal", log.read_text())
    latest = run.checkpoints.latest_file
    if proc.returncode != 75 or stopped is None or not latest.is_file():
        tail = log.read_text()[-3000:]
        raise SystemExit(f"{tail}\n{name}: exit {proc.returncode} after TERM, no signal save")
    step = int(stopped[1])
    tag_dir = run.checkpoints.tag_dir(tag_for(step))
    size = sum(p.stat().st_size for p in tag_dir.rglob("*") if p.is_file())
    case = {"preset": name, "step": step}
    return [
        row("TERM to exit", exited, "s", **case, exit_status=proc.returncode),
        row("TERM to latest checkpoint", latest.stat().st_mtime - sent_wall, "s", **case),
        row("signal checkpoint size", size / 2**20, "MiB", **case),
    ]
