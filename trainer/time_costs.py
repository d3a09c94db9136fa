"""A run's time as the trainer reckons it, and what `paperscale plan` prices with the same
arithmetic (launch/cost_model/run_time.py): its steps, evaluations, BLEU passes and saves to a
given step, the last step a time budget holds (trainer/budget.py), and how many sentences an
in-training BLEU decodes (trainer/target.py). Pure arithmetic: no torch, so that `plan`
answers without importing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

WHOLE_SPLIT = 1 << 30  # sentences: more than any validation split holds
SAFETY = 0.97  # of the budget left, planned for (the rest absorbs noise in the step time)
BLEU_PROBE_SAMPLES = 16  # sentences decoded to time BLEU, scaled to train.bleu_samples


@dataclass(frozen=True)
class Costs:
    """Measured seconds: one training step, one validation pass, one BLEU evaluation (of
    train.bleu_samples sentences; 0 when no BLEU is due) and one save."""

    step_s: float
    eval_s: float
    bleu_s: float
    save_s: float


@dataclass(frozen=True)
class Cadence:
    """How often evaluations and saves come (steps; 0 = only at the end)."""

    eval_every: int
    bleu_every: int
    save_every: int


def _due_between(every: int, first: int, last: int) -> int:
    """Multiples of `every` in [first, last) (0 when `every` is 0): the periodic events
    before the final step, whose own evaluation and save are counted apart."""
    if every <= 0 or last <= first:
        return 0
    return (last - 1) // every - (first - 1) // every


def time_to(step: int, horizon: int, costs: Costs, cadence: Cadence) -> float:
    """Seconds from after `step` to the end of a run whose last step is `horizon`: its steps,
    the evaluations and saves due before it, and the final evaluation (with BLEU) and save."""
    first = step + 1
    evals = _due_between(cadence.eval_every, first, horizon)
    bleus = _due_between(cadence.bleu_every, first, horizon)
    saves = _due_between(cadence.save_every, first, horizon)
    return (
        (horizon - step) * costs.step_s
        + (evals + 1) * costs.eval_s
        + (bleus + 1) * costs.bleu_s
        + (saves + 1) * costs.save_s
    )


def plan_horizon(step: int, left_s: float, costs: Costs, cadence: Cadence, max_steps: int) -> int:
    """The last step of a run at `step` with `left_s` seconds left: the largest horizon whose
    remaining work fits SAFETY of the time left, at most `max_steps` and at least `step + 1`."""
    budget = SAFETY * left_s
    if time_to(step, step + 1, costs, cadence) >= budget:
        return min(step + 1, max_steps)
    per_step = costs.step_s
    per_step += costs.eval_s / cadence.eval_every if cadence.eval_every else 0.0
    per_step += costs.bleu_s / cadence.bleu_every if cadence.bleu_every else 0.0
    per_step += costs.save_s / cadence.save_every if cadence.save_every else 0.0
    fixed = costs.eval_s + costs.bleu_s + costs.save_s
    guess = step + max(1, math.floor((budget - fixed) / per_step))
    guess = min(guess, max_steps)
    # the amortised guess is within a few events of the exact count: walk to it
    while guess > step + 1 and time_to(step, guess, costs, cadence) > budget:
        guess -= 1
    while guess < max_steps and time_to(step, guess + 1, costs, cadence) <= budget:
        guess += 1
    return guess


def bleu_seconds(t_small: float, small: int, t_large: float, large: int, wanted: int) -> float:
    """Seconds to decode `wanted` sentences, from decodes of `small` and `large` sentences
    taking `t_small` and `t_large` s: a fixed part and a part per sentence, the line through
    both; never less than the larger decode took (a noisy pair can slope down)."""
    per = max(t_large - t_small, 0.0) / (large - small)
    fixed = max(t_small - per * small, 0.0)
    return max(fixed + per * wanted, t_large)


def bleu_samples(train: Any) -> int:
    """Sentences the in-training BLEU decodes: train.bleu_samples, or all of the validation
    split where BLEU is the target."""
    return WHOLE_SPLIT if train.target_bleu > 0 else int(train.bleu_samples)
