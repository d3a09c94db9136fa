"""Seconds from SIGTERM to exit 75 of a 2-rank training run, as Slurm's preemption delivers it.

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu .venv/bin/python -m bench.preemption \\
        --work /tmp/bench-preemption [--data data/debian-ende] \\
        [--preset tiny=configs/tiny.yaml] [--preset base=configs/base.yaml] [--after 3] \\
        [--smoke] [--json PATH]

Per preset: `paperscale train --nproc 2` (the preset, fp32/bf16 as `precision: auto` picks,
the data given, `data.max_tokens` of the tiny preset for every preset so that a base step
takes seconds on a CPU), its own process group; once --after steps are logged, SIGTERM to
the whole group (the `paperscale` parent, torchrun, both ranks, the loader workers), as Slurm
does on preemption or `scancel`. Figures: seconds from TERM to the new `latest` pointer
(the step in flight finished or abandoned, then the save), from TERM to the exit, the exit
status (75 expected), the step saved, and the checkpoint's size; against the grace period of
`train.stop_grace_s` (30 s, Slurm's default KillWait).

`--smoke`: a synthetic corpus, d_model 32, the tiny preset only (seconds).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import (
    CLI,
    ROOT,
    SMOKE_MODEL,
    add_output_arguments,
    prepare_synthetic,
    row,
    write_rows,
)
from data_pipeline.manifest import read_manifest
from trainer.metrics import read_metrics
from trainer.run_dir import RunDir, tag_for

START_TIMEOUT_S = 900.0  # start-up plus --after steps of the base model on 2 CPU cores
EXIT_TIMEOUT_S = 120.0  # past Slurm's 30 s the job would have been killed; this only bounds a hang


def logged_steps(run: RunDir) -> int:
    return sum(1 for r in read_metrics(run.metrics) if r.get("loss") is not None)


def latest_mtime(run: RunDir) -> float | None:
    path = run.checkpoints.latest_file
    return path.stat().st_mtime if path.is_file() else None


def preempt(name: str, config: str, data: Path, run_dir: Path, args: argparse.Namespace) -> dict:
    """One run TERMed after `args.after` logged steps; what happened, in seconds."""
    run = RunDir(run_dir)
    cmd = [
        *CLI, "train", "--config", config, "--nproc", "2",
        "--run-dir", str(run_dir), f"data.dir={data}",
        f"data.vocab_size={read_manifest(data)['vocab_size']}",  # a preset's own may differ
        "data.max_tokens=1536",
        "train.max_steps=100000", "train.log_every=1", "train.eval_every=0",
        "train.save_every=0", "train.bleu_every=0", "logging.wandb=disabled",
        "logging.tensorboard=false", "logging.report=false", *args.overrides,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    shutil.rmtree(run_dir.parent, ignore_errors=True)  # a fresh run, not a resumed one
    run_dir.parent.mkdir(parents=True)
    log = (run_dir.parent / f"{name}.log").open("w")
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while logged_steps(run) < args.after:
            if proc.poll() is not None:
                raise SystemExit(f"{name}: train exited {proc.returncode} before step {args.after}")
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: fewer than {args.after} steps in {START_TIMEOUT_S} s")
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)  # every process of the run, as Slurm signals a job
        sent_wall, sent = time.time(), time.monotonic()
        proc.wait(timeout=EXIT_TIMEOUT_S)
        exited = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    text = (run_dir.parent / f"{name}.log").read_text()
    stopped = re.search(r"stopped at step (\d+) after a signal", text)
    saved_at = latest_mtime(run)
    if proc.returncode != 75 or stopped is None or saved_at is None:
        sys.stderr.write(text[-3000:])
        raise SystemExit(f"{name}: exit {proc.returncode} after TERM, no signal save")
    step = int(stopped[1])
    tag_dir = run.checkpoints.tag_dir(tag_for(step))
    size = sum(p.stat().st_size for p in tag_dir.rglob("*") if p.is_file())
    return {
        "preset": name,
        "exit": proc.returncode,
        "step": step,
        "to_latest_s": saved_at - sent_wall,
        "to_exit_s": exited,
        "size_mib": size / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--data", type=Path, default=ROOT / "data/debian-ende")
    p.add_argument(
        "--preset", action="append", metavar="NAME=CONFIG", help="repeatable (default tiny, base)"
    )
    p.add_argument("--after", type=int, default=3, help="steps logged before TERM")
    p.add_argument("overrides", nargs="*", help="key=value for every run")
    add_output_arguments(p, "a synthetic corpus, d_model 32, the tiny preset")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    presets = args.preset or ["tiny=configs/tiny.yaml", "base=configs/base.yaml"]
    if args.smoke:
        args.data, presets = prepare_synthetic(args.work, 2000), ["tiny=configs/tiny.yaml"]
        args.overrides = [*SMOKE_MODEL, *args.overrides]
    if not (args.data / "manifest.json").is_file():
        p.error(f"--data {args.data}: no manifest.json (paperscale prepare it first)")
    rows = []
    print(f"{'preset':8s} {'exit':>4s} {'step':>5s} {'TERM->latest s':>15s} "
          f"{'TERM->exit s':>13s} {'checkpoint MiB':>15s}")  # fmt: skip
    for spec in presets:
        name, _, config = spec.partition("=")
        r = preempt(name, config, args.data, args.work / name / "run", args)
        print(f"{name:8s} {r['exit']:4d} {r['step']:5d} {r['to_latest_s']:15.2f} "
              f"{r['to_exit_s']:13.2f} {r['size_mib']:15,.0f}")  # fmt: skip
        case = {"preset": name, "step": r["step"]}
        rows += [
            row("TERM to exit", r["to_exit_s"], "s", **case, exit_status=r["exit"]),
            row("TERM to latest checkpoint", r["to_latest_s"], "s", **case),
            row("signal checkpoint size", r["size_mib"], "MiB", **case),
        ]
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
