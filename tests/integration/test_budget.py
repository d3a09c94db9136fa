"""`train.budget_minutes`: a 2-rank run given a minute measures its step time, fixes its
last step, and ends there, at its time, with the learning rate at the end of its schedule.
It asserts a time, so it runs alone (serial)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL, paperscale
from trainer.budget import BUDGET_OVERRUN

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.serial]

BUDGET_MIN = 1.0


def test_a_budget_ends_the_run_at_its_time_with_the_schedule_at_its_end(
    synthetic_data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "budget"
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "2",
        "--run-dir", str(run_dir), f"data.dir={synthetic_data}", *TINY_MODEL,
        f"train.budget_minutes={BUDGET_MIN}", "train.max_steps=100000",
        "train.budget_calibration_steps=10", "train.budget_calibration_fraction=0.5",
        "optim.schedule=linear", "optim.warmup_steps=5",
        "train.log_every=1", "train.eval_every=50", "train.eval_max_batches=2",
        "train.save_every=100", "train.bleu_samples=4", "data.num_workers=0",
        "logging.wandb=disabled", "logging.tensorboard=false",
        cwd=tmp_path, timeout=240,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    fixed = [r for r in records if "horizon" in r]
    # measured from 15 s of training to 30 s (at least 3 steps left alone, 10 measured)
    assert len(fixed) == 1 and fixed[0]["step"] >= 13
    assert "valid_loss" in fixed[0]  # the validation pass it timed is logged
    horizon = int(fixed[0]["horizon"])
    assert horizon > 50, out[-2000:]  # a minute holds many steps of this model
    lr = {r["step"]: r["lr"] for r in records if "lr" in r}
    assert max(lr) == horizon  # ended at its horizon, not by max_steps or by running over
    assert lr[horizon - 1] > 0 and lr[horizon] == 0.0  # the last step used the last lr > 0
    assert "spent at step" not in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["horizon"] == horizon
    spent = summary["budget_spent_s"]
    assert 0.6 * 60 * BUDGET_MIN <= spent <= (1 + BUDGET_OVERRUN) * 60 * BUDGET_MIN, spent
    assert (run_dir / "checkpoints" / f"step_{horizon:08d}").is_dir()
