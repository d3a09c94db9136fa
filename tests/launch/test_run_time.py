"""A run's time beyond its steps (launch/cost_model/run_time.py): evaluations priced from the
calibration's timings and shared by the ranks, a BLEU target's whole split, a budget's horizon
reckoned as the trainer reckons it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from launch.cost_model.run_time import at_bleu_evaluation, budget_horizon, run_time
from launch.cost_model.speed import Calibration, EventTimings
from trainer.time_costs import SAFETY, Cadence, Costs, plan_horizon, time_to


def train(**over: float) -> SimpleNamespace:
    base = dict(
        eval_every=200, bleu_every=0, save_every=200, eval_max_batches=0, bleu_samples=200,
        bleu_beam=1, target_bleu=0.0, budget_minutes=0.0, max_steps=1_000_000,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **over})


def calibration(events: EventTimings | None, startup_s: float = 4.0) -> Calibration:
    return Calibration(
        path="cal.json", device="cpu", device_name="cpu", gpu_key=None, precision="fp32",
        threads=1, flops_per_s=1e10, overhead_s=0.01, overhead_micro_s=0.0, peak_flops=None,
        model={}, memory_gib=None, startup_s=startup_s, events=events,
    )  # fmt: skip


# a world of one timed: the validation pass 6 s, decodes of 100 and 200 sentences 3 and 5 s
# (1 s whatever the size + 0.02 s a sentence)
EVENTS = EventTimings(
    valid_samples=1000,
    eval_max_batches=0,
    eval_s=6.0,
    bleu_beam=1,
    decodes=((100, 3.0), (200, 5.0)),
)


def test_without_timed_evaluations_only_saves_and_steps_are_priced() -> None:
    rt = run_time(None, train(), world=2, step_s=0.5, save_s=1.5)
    assert not rt.priced and rt.startup_s == 0 and rt.costs == Costs(0.5, 0.0, 0.0, 1.5)
    # 1,000 steps: saves at 200, 400, 600, 800 and the last one's
    assert rt.seconds_to(1000) == pytest.approx(1000 * 0.5 + 5 * 1.5)
    assert rt.target_seconds(1000) == pytest.approx(1000 * 0.5 + 4 * 1.5)


def test_evaluations_are_shared_by_the_ranks_and_a_bleu_target_decodes_the_whole_split() -> None:
    rt = run_time(calibration(EVENTS), train(bleu_every=400), world=2, step_s=0.5, save_s=1.0)
    assert rt.priced and rt.startup_s == 4.0
    assert rt.costs.eval_s == pytest.approx(3.0)  # half the split per rank
    assert rt.costs.bleu_s == pytest.approx(1.0 + 0.02 * 100)  # 100 of 200 sentences per rank
    # to step 1,000: evaluations at 200..800 (4) and the last; BLEU at 400, 800 and the last
    want = 4.0 + 1000 * 0.5 + 5 * 3.0 + 3 * 3.0 + 5 * 1.0
    assert rt.seconds_to(1000) == pytest.approx(want)
    target = run_time(calibration(EVENTS), train(bleu_every=400, target_bleu=90.0), 2, 0.5, 1.0)
    assert target.costs.bleu_s == pytest.approx(1.0 + 0.02 * 500)  # all 1,000: 500 per rank
    capped = calibration(dataclasses.replace(EVENTS, eval_max_batches=10))
    rt = run_time(capped, train(eval_max_batches=10), 2, 0.5, 1.0)
    assert rt.costs.eval_s == pytest.approx(6.0)  # each rank runs the batches it is given


@pytest.mark.parametrize("over", [{"eval_max_batches": 10}, {"bleu_beam": 4}])
def test_evaluations_timed_with_other_settings_are_not_priced(over: dict) -> None:
    rt = run_time(calibration(EVENTS), train(**over), 2, 0.5, 1.0)
    assert not rt.priced and rt.costs.eval_s == rt.costs.bleu_s == 0.0
    assert rt.why.startswith("the calibration timed train.eval_max_batches=0, bleu_beam=1")
    assert run_time(calibration(None), train(), 2, 0.5, 1.0).why.startswith("the calibration")


def test_a_budget_is_filled_as_the_trainer_fills_it() -> None:
    job = train(budget_minutes=12.0)
    rt = run_time(calibration(EVENTS), job, world=2, step_s=0.4, save_s=1.0)
    horizon = budget_horizon(job, rt)
    assert horizon is not None
    left = 720.0 - rt.startup_s - rt.probe_s
    assert rt.probe_s == pytest.approx(3.0 + (1.0 + 0.02 * 8) + (1.0 + 0.02 * 4))
    assert horizon == plan_horizon(0, left, rt.costs, rt.cadence, job.max_steps)
    costs, cadence = rt.costs, Cadence(200, 0, 200)
    assert (
        time_to(0, horizon, costs, cadence)
        <= SAFETY * left
        < time_to(0, horizon + 1, costs, cadence)
    )
    assert budget_horizon(train(), rt) is None  # no budget: no horizon
    short = train(budget_minutes=12.0, max_steps=500)
    assert budget_horizon(short, run_time(None, short, 2, 0.4, 1.0)) == 500  # max_steps bounds it


@pytest.mark.parametrize(
    ("steps", "over", "want"),
    [(950, {"target_bleu": 90.0, "bleu_every": 200}, 1000),
     (1000, {"target_bleu": 90.0, "bleu_every": 200}, 1000),
     (950, {"bleu_every": 200}, 950),  # no BLEU target: the anchor's steps as they are
     (950, {"target_bleu": 90.0}, 950)],  # no BLEU cadence: nothing to round to
)  # fmt: skip
def test_a_bleu_target_is_reached_at_an_evaluation_that_scores_bleu(
    steps: int, over: dict, want: int
) -> None:
    assert at_bleu_evaluation(steps, train(**over)) == want
