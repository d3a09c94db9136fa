"""The budget's pure parts: the horizon it fixes, the time it plans for, the schedule it
drives, and the train state that carries it from one attempt to the next."""

from __future__ import annotations

import time

import pytest
import torch

from trainer.budget import BudgetClock, decay_start
from trainer.schedule import Horizon, build_scheduler, linear_decay_lr
from trainer.state import TrainState
from trainer.time_costs import SAFETY, Cadence, Costs, bleu_seconds, plan_horizon, time_to

COSTS = Costs(step_s=1.0, eval_s=10.0, bleu_s=20.0, save_s=5.0)


def test_time_to_counts_steps_periodic_events_and_the_final_ones() -> None:
    cadence = Cadence(eval_every=10, bleu_every=0, save_every=25)
    # after step 20 to step 100: 80 steps, evals at 30..90 (7) + final, saves at 25, 50, 75
    # (3, none at 100: the final save) + final, BLEU only at the end
    expected = 80 * 1.0 + (7 + 1) * 10.0 + 1 * 20.0 + (3 + 1) * 5.0
    assert time_to(20, 100, COSTS, cadence) == pytest.approx(expected)


def test_the_horizon_is_the_last_step_that_fits_the_budget() -> None:
    cadence = Cadence(eval_every=10, bleu_every=50, save_every=25)
    for left in (100.0, 500.0, 1234.5, 10_000.0):
        horizon = plan_horizon(20, left, COSTS, cadence, max_steps=10**6)
        assert time_to(20, horizon, COSTS, cadence) <= SAFETY * left
        assert time_to(20, horizon + 1, COSTS, cadence) > SAFETY * left


def test_the_horizon_is_capped_by_max_steps_and_is_at_least_the_next_step() -> None:
    cadence = Cadence(0, 0, 0)
    assert plan_horizon(20, 10_000.0, COSTS, cadence, max_steps=50) == 50
    assert plan_horizon(20, 1.0, COSTS, cadence, max_steps=50) == 21


def test_decay_starts_at_the_warmups_end_or_after_the_fixing_step() -> None:
    assert decay_start(warmup_steps=100, step=23) == 100
    assert decay_start(warmup_steps=10, step=23) == 24


def test_linear_schedule_holds_the_peak_until_the_horizon_is_fixed_then_decays_to_zero() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=123.0)
    horizon = Horizon()
    sched = build_scheduler(opt, d_model=512, warmup_steps=2, lr=1e-3, warmup_init_lr=0.0,
                            schedule="linear", horizon=horizon)  # fmt: skip
    seen = []
    for step in range(1, 11):
        seen.append(opt.param_groups[0]["lr"])  # the lr of `step`
        opt.step()
        sched.step()
        if step == 4:  # fixed after step 4: decay from step 5, zero after step 8
            horizon.total_steps, horizon.decay_from = 8, decay_start(2, 4)
    assert seen[:5] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3, 1e-3])
    assert seen[4:8] == pytest.approx([1e-3 * (9 - k) / 4 for k in range(5, 9)])
    assert seen[7] > 0 and seen[8] == seen[9] == 0.0


def test_linear_decay_lr_from_a_later_start() -> None:
    lr = [linear_decay_lr(k, peak=1.0, warmup_steps=2, total_steps=7, decay_from=4)
          for k in range(1, 9)]  # fmt: skip
    assert lr == pytest.approx([0.5, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0])


def test_train_state_carries_the_horizon_in_place_and_reads_old_checkpoints() -> None:
    state = TrainState(step=40, wandb_id="abc")
    state.horizon.total_steps, state.horizon.decay_from, state.budget_spent_s = 900, 24, 61.5
    restored = TrainState()
    same_object = restored.horizon
    restored.load_state_dict(state.state_dict())
    assert restored.horizon is same_object  # the scheduler's reference stays valid
    assert (restored.horizon.total_steps, restored.horizon.decay_from) == (900, 24)
    assert restored.budget_spent_s == 61.5
    old = TrainState()
    old.load_state_dict({"step": 7, "tokens_seen": 1, "wandb_id": "x"})  # before budgets
    assert old.step == 7 and old.horizon.total_steps == 0


def test_clock_window_leaves_evaluations_out_and_carries_time_spent() -> None:
    clock = BudgetClock(budget_minutes=1.0, calibration_steps=2)  # fraction 0: at once
    clock.start(start_step=10, carried_s=50.0)
    assert 50.0 <= clock.spent_s() < 55.0
    clock.after_step(12)
    assert clock.mark is None  # 3 steps of the attempt first
    clock.after_step(13)
    assert not clock.ready(14, Horizon()) and clock.ready(15, Horizon())
    assert not clock.ready(15, Horizon(total_steps=99))  # fixed already: never again
    with clock.outside():
        time.sleep(0.3)  # an evaluation inside the window
    assert 0.0 <= clock.measured_step_s(15) < 0.1
    clock.carried_s = 100.0
    assert clock.over()  # 100 s of a 60 s budget, past its overrun allowance


def test_the_window_opens_and_closes_at_shares_of_the_budget_after_the_first_step() -> None:
    clock = BudgetClock(budget_minutes=10.0, calibration_steps=2, calibration_fraction=0.1)
    clock.start(start_step=0, carried_s=100.0)  # spent before: start-up is not training
    clock.after_step(1)  # training time counts from here
    clock.after_step(5)
    assert clock.mark is None  # 30 s (half of 10 % of 600 s) of training not passed yet
    clock.carried_s += 31.0
    clock.after_step(6)
    assert clock.mark is not None and clock.mark[0] == 6
    assert not clock.ready(20, Horizon())  # 20 steps measured, but not 60 s of training
    clock.carried_s += 30.0
    assert not clock.ready(7, Horizon()) and clock.ready(8, Horizon())
    assert BudgetClock(1.0, 2, 0.1).measured_step_s(9) == 0.0  # no window on this rank


def test_bleu_time_separates_the_fixed_cost_from_the_per_sentence_cost() -> None:
    # 8 sentences in 1.2 s, 16 in 1.4 s: 1.0 s whatever the size, 0.025 s a sentence
    assert bleu_seconds(1.2, 8, 1.4, 16, 200) == pytest.approx(1.0 + 200 * 0.025)
    # scaling the 16-sentence decode (the old estimate) would say 17.5 s
    assert bleu_seconds(1.2, 8, 1.4, 16, 200) < 1.4 * 200 / 16  # 6.0 s against 17.5
    # a noisy pair (the larger decode faster) is never below what a decode was seen to take
    assert bleu_seconds(1.5, 8, 1.4, 16, 200) == pytest.approx(1.5)
    # purely per-sentence: the old scaling
    assert bleu_seconds(0.5, 8, 1.0, 16, 200) == pytest.approx(12.5)
    # one sentence to probe with: the empty decode (0 s) is the smaller one, the old scaling
    assert bleu_seconds(0.0, 0, 0.5, 1, 200) == pytest.approx(100.0)
