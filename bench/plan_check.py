"""`paperscale plan` set against the runs it plans, on 2 CPU ranks of this machine: the horizon
a time budget fixes (the demo preset, 12 minutes) and the time to a BLEU target (the synthetic
task, train.target_bleu=90).

Each case is what a user types: `paperscale calibrate --config C --out CAL --ranks 2` (the
run's 2 ranks in one world, one thread each), `paperscale plan --config C --nodes 1
--gpus-per-node 2 --calibration CAL --json`, then `paperscale train --config C --nproc 2`; the
plan's figures against the run's summary and log.
The time to target is given twice: as planned from the anchor's steps (what a user is told
before the run), and as the plan's time to the step the run did reach its target at (the time
model alone, without the anchor's steps). At smoke size: the smoke model on small synthetic
data, a budget of 0.25 min, and a validation-NLL target the first evaluation reaches (no anchor
holds such a model: its figure is the time model's alone).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bench.common import (
    CLI,
    CPU_ENV,
    ROOT,
    SMOKE_MODEL,
    Row,
    prepare_synthetic,
    row,
    run_command,
    train_run,
)
from launch.cost_model.run_time import RunTime
from trainer.run_dir import RunDir
from trainer.time_costs import Cadence, Costs

MEASURED = re.compile(r"budget: .*?; measured ([0-9.]+) s per step")
SMOKE_CALIBRATION = ("--tokens", "64,256", "--steps", "2", "--seq-len", "16")


def measure(
    work: Path,
    budget_config: str = "configs/demo.yaml",
    budget_data: str = "data/debian-ende",
    target_config: str = "configs/synthetic.yaml",
    target: str = "train.target_bleu=90",
    smoke: bool = False,
) -> list[Row]:
    """Both cases (each a config, its data and its overrides); at smoke size the target is a
    validation NLL the first evaluation reaches."""
    target_data = prepare_synthetic(work, 2000 if smoke else 20000)
    budget_path = target_data if smoke else ROOT / budget_data
    small = [*SMOKE_MODEL, "data.num_workers=0", "train.eval_every=10"] if smoke else []
    small += ["data.vocab_size=300"] if smoke else []  # the synthetic data's
    budget_over = [f"data.dir={budget_path}", *small]
    if smoke:
        budget_over += ["train.budget_minutes=0.25", "train.save_every=10"]
    target_over = [f"data.dir={target_data}", *small, target]
    if smoke:
        target_over = [*target_over[:-1], "train.target_nll=100", "train.max_steps=100"]
    return [
        *budget_case(work / "budget", budget_config, budget_over, smoke),
        *target_case(work / "target", target_config, target_over, smoke),
    ]


def calibrated_plan(work: Path, config: str, overrides: Sequence[str], smoke: bool) -> dict:
    """`calibrate` (one rank) and `plan` (2 ranks on this machine, --json) of the config."""
    work.mkdir(parents=True, exist_ok=True)
    cal = work / "calibration.json"
    size = SMOKE_CALIBRATION if smoke else ()
    run = [*CLI, "calibrate", "--config", config, "--out", str(cal), "--ranks", "2", *size,
           *overrides]  # fmt: skip
    run_command(run, work / "calibrate.log", CPU_ENV, timeout=900)
    plan = [*CLI, "plan", "--config", config, "--nodes", "1", "--gpus-per-node", "2",
            "--calibration", str(cal), "--json", *overrides]  # fmt: skip
    env = {**os.environ, **CPU_ENV}
    out = subprocess.run(plan, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"plan exited {out.returncode}: {out.stderr[-2000:]}")
    (work / "planned.json").write_text(out.stdout)
    return json.loads(out.stdout)


def planned_run_time(plan: dict) -> RunTime:
    """The plan's figures of what the run spends beside its steps, as a RunTime."""
    rt = plan["run_time"]
    costs = Costs(plan["time_basis"]["step_s"], rt["eval_s"], rt["bleu_s"], rt["save_s"])
    cadence = Cadence(rt["eval_every"], rt["bleu_every"], rt["save_every"])
    return RunTime(rt["startup_s"], costs, cadence, rt["probe_s"], rt["priced"], rt["why"])


def trained(work: Path, config: str, overrides: Sequence[str]) -> tuple[dict, str]:
    """A 2-rank run of the config: its summary and its log."""
    run_dir, log = work / "run", work / "train.log"
    train_run(config, run_dir, overrides, log=log, timeout=3600)
    summary = RunDir(run_dir).read_summary() or {}
    return summary, log.read_text()


def budget_case(work: Path, config: str, overrides: Sequence[str], smoke: bool) -> list[Row]:
    """The horizon the plan predicts for the budget against the one the run fixed."""
    plan = calibrated_plan(work, config, overrides, smoke)
    summary, log = trained(work, config, overrides)
    planned, fixed = plan["run_time"]["horizon"], summary.get("horizon")
    if planned is None or not fixed:
        raise SystemExit(f"{config}: no horizon (planned {planned}, run {fixed}); see {work}")
    measured = MEASURED.search(log)
    ctx = {"config": config, "ranks": 2, "priced": plan["run_time"]["priced"]}
    rows = [
        row("budget: planned step", plan["time_basis"]["step_s"], "s", **ctx),
        row("budget: the run's measured step", float(measured[1]) if measured else 0.0, "s"),
        row("budget: planned horizon", planned, "steps", **ctx),
        row("budget: the run's horizon", fixed, "steps", **ctx),
        row("budget: planned / the run's horizon", planned / fixed, "x", **ctx),
    ]
    return rows


def target_case(work: Path, config: str, overrides: Sequence[str], smoke: bool) -> list[Row]:
    """The time to target the plan predicts against the run's time_to_target_s."""
    plan = calibrated_plan(work, config, overrides, smoke)
    summary, _ = trained(work, config, overrides)
    if not summary.get("target_reached"):
        raise SystemExit(f"{config}: the run did not reach {summary.get('target')}; see {work}")
    step, seconds = int(summary["target_step"]), float(summary["time_to_target_s"])
    at_step = planned_run_time(plan).target_seconds(step)
    ctx = {"config": config, "ranks": 2, "target": summary["target"]}
    rows = [
        row("target: the run's step", step, "steps", **ctx),
        row("target: the run's time_to_target_s", seconds, "s", **ctx),
        row("target: planned time to the run's step", at_step, "s", **ctx),
        row("target: planned / measured time, at the run's step", at_step / seconds, "x", **ctx),
    ]
    quality = plan.get("quality")
    if quality:
        planned = float(quality["hours"]) * 3600
        rows += [
            row(
                "target: planned step (anchor)", quality["steps"], "steps", anchor=quality["anchor"]
            ),
            row("target: planned time to target (anchor)", planned, "s", **ctx),
            row("target: planned / measured time to target", planned / seconds, "x", **ctx),
        ]
    return rows
