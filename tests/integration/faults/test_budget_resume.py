"""A run on a time budget that is killed and restarted in place keeps the horizon it fixed
(it is in the checkpoint) and ends with the weights of an uninterrupted run, bitwise.

The budget is generous and train.max_steps caps the horizon, so that both runs fix the same
one whatever the machine's speed; what is tested is that a resumed attempt takes the saved
horizon and schedule instead of measuring again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.faults.conftest import fault_env, losses, overrides, resumed_steps
from tests.integration.faults.test_kill_restart import same_weights, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 12  # the horizon: the cap, since 10 minutes hold far more steps
BUDGET = [
    "train.budget_minutes=10", "train.budget_calibration_steps=2", "optim.schedule=linear",
    "optim.warmup_steps=2", "optim.lr=0.002", "train.save_every=2",
    "train.budget_calibration_fraction=0",  # measured from step 3, whatever the time
]  # fmt: skip
FIXED_AT = 5  # 3 steps left alone, then 2 measured


def lrs(run_dir: Path) -> dict[int, float]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in records if "lr" in r}


def test_a_budgeted_run_killed_and_resumed_keeps_its_horizon_and_weights(
    synthetic_data: Path, tmp_path: Path
) -> None:
    over = overrides(synthetic_data, STEPS, *BUDGET)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    out_straight = train(straight, over)
    out = train(killed, over, fault_env(rank="1", kill_at_step="8"))
    for text in (out_straight, out):
        assert text.count("budget: train.budget_minutes=10;") == 1, text[-3000:]
        assert f"the run ends at step {STEPS}, the learning rate decaying from step 6" in text
    assert resumed_steps(out) == [6]
    got, want = losses(killed), losses(straight)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == [want[s] for s in sorted(want)]  # bitwise
    assert same_weights(killed, straight)
    lr = lrs(killed)  # logged after each step: the lr of the next one
    assert lr[FIXED_AT] == pytest.approx(0.002)  # the peak until the decay starts at step 6
    assert lr[STEPS - 1] == pytest.approx(0.002 / 7) and lr[STEPS] == 0.0
    assert lrs(straight) == lr
