"""A run's time beyond its steps, for `paperscale plan`: its start-up, its evaluations, BLEU
passes and saves, priced with the trainer's own accounting (trainer/time_costs.py `time_to` and
`plan_horizon`), so that the plan's time to a step and the horizon it predicts for a time budget
are what the run itself would reckon.

Where the figures come from:
- start-up: the calibration's engine build and the extra of its first step (a compiled
  model's compile); 0 without a calibration.
- a validation pass: the calibration's timing of the trainer's own pass over the config's
  prepared validation split (launch/cost_model/calibrate.py), a rank's share of it then (1/N of
  the split in a calibration of N ranks) scaled to the run's ranks' (with
  train.eval_max_batches each rank runs that many batches, whatever the world).
- a BLEU pass: the line through the calibration's two decodes (half of the sentences and all of
  them, as long as their references: a trained model's length; each rank its share), at the
  run's ranks' share of the sentences.
- a save: the checkpoint's size at `--write-gbs` (launch/cost_model/save.py).
Without a calibration that timed them (no prepared data.dir when it ran, or other
train.eval_max_batches or bleu_beam than the config's), evaluations cost 0 and the plan says
they are not priced, and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from launch.cost_model.speed import Calibration
from trainer.time_costs import (
    BLEU_PROBE_SAMPLES,
    Cadence,
    Costs,
    bleu_samples,
    plan_horizon,
    time_to,
)


@dataclass(frozen=True)
class RunTime:
    """What a run of the planned config spends besides its steps, and how often."""

    startup_s: float
    costs: Costs  # per step, per validation pass, per BLEU pass, per save
    cadence: Cadence
    probe_s: float  # a budget's probe: one validation pass and two short decodes
    priced: bool  # the evaluations were timed (a calibration with the config's data)
    why: str = ""  # why they are not priced

    def seconds_to(self, steps: int) -> float:
        """From the trainer's start to the end of step `steps`' evaluation (with BLEU) and save:
        a run of `steps` steps."""
        return self.startup_s + time_to(0, steps, self.costs, self.cadence)

    def target_seconds(self, steps: int) -> float:
        """`time_to_target_s` of a run that reaches its target at the evaluation of `steps`:
        up to that evaluation, its save after it not counted (trainer/target.py)."""
        return self.seconds_to(steps) - self.costs.save_s


def _share(sentences: int, world: int) -> int:
    return math.ceil(sentences / world)


def run_time(
    cal: Calibration | None, train: Any, world: int, step_s: float, save_s: float
) -> RunTime:
    """The run's costs on `world` ranks at `step_s` per step (`train`: the config's train
    section), from the calibration where it timed them."""
    cadence = Cadence(int(train.eval_every), int(train.bleu_every), int(train.save_every))
    events = cal.events if cal is not None else None
    startup = cal.startup_s if cal is not None else 0.0
    why = "" if events is not None else "the calibration timed none (no prepared data.dir)"
    if cal is None:
        why = "no calibration"
    elif events is not None and (events.eval_max_batches, events.bleu_beam) != (
        int(train.eval_max_batches),
        int(train.bleu_beam),
    ):
        why = (
            f"the calibration timed train.eval_max_batches={events.eval_max_batches}, "
            f"bleu_beam={events.bleu_beam}, not this config's"
        )
    if why or events is None:
        return RunTime(startup, Costs(step_s, 0.0, 0.0, save_s), cadence, 0.0, False, why)
    timed = events.world  # the ranks that shared the split when it was timed
    eval_s = events.eval_s if events.eval_max_batches else events.eval_s * timed / world
    (small, t_small), (large, t_large) = events.decodes
    small, large = _share(small, timed), _share(large, timed)  # each rank's sentences then
    # a sentence's share, and a decode's whatever its size (the larger decode's alone where
    # both gave a rank as many sentences)
    per = max(t_large - t_small, 0.0) / (large - small) if large > small else 0.0
    fixed = max(t_small - per * small, 0.0) if large > small else t_large

    def decode_s(sentences: int) -> float:
        """A rank's decode of its share of `sentences`: the line through both timings."""
        return fixed + per * _share(sentences, world)

    wanted = min(bleu_samples(train), events.valid_samples)
    probe = min(BLEU_PROBE_SAMPLES, int(train.bleu_samples))
    probe_s = eval_s + decode_s(probe) + (decode_s(probe // 2) if probe // 2 else 0.0)
    costs = Costs(step_s, eval_s, decode_s(wanted), save_s)
    return RunTime(startup, costs, cadence, probe_s, True)


def budget_horizon(train: Any, rt: RunTime) -> int | None:
    """The last step a time budget (train.budget_minutes) fixes, as the trainer fixes it: what
    is left after the start-up and its probe, filled with steps, evaluations and saves (the
    final ones too) to trainer.budget's SAFETY of it. None without a budget."""
    if not train.budget_minutes > 0:
        return None
    left = 60.0 * float(train.budget_minutes) - rt.startup_s - rt.probe_s
    return plan_horizon(0, left, rt.costs, rt.cadence, int(train.max_steps))


def at_bleu_evaluation(steps: int, train: Any) -> int:
    """`steps` rounded up to the next evaluation that scores BLEU (train.bleu_every), where a
    BLEU target is checked; unchanged without a BLEU target or cadence."""
    every = int(train.bleu_every)
    if not (train.target_bleu > 0 and every > 0):
        return steps
    return math.ceil(steps / every) * every


def run_time_lines(plan: dict) -> list[str]:
    """What the time lines add to the steps, and the budget's horizon, as `plan` prints them."""
    rt = plan.get("run_time")
    if not rt:
        return []

    def when(every: int) -> str:
        return f"every {every}" if every else "at the end"

    if rt["priced"]:
        what = (
            f"start-up {rt['startup_s']:.1f} s; validation {rt['eval_s']:.2f} s "
            f"{when(rt['eval_every'])}, BLEU {rt['bleu_s']:.2f} s {when(rt['bleu_every'])}, "
            f"save {rt['save_s']:.2f} s {when(rt['save_every'])} (per rank, from the calibration)"
        )
    else:
        what = (
            f"start-up {rt['startup_s']:.1f} s; evaluations not priced ({rt['why']}: "
            "`paperscale calibrate` of the config with its prepared data.dir times them); "
            f"save {rt['save_s']:.2f} s {when(rt['save_every'])}"
        )
    lines = [f"beyond steps     {what}"]
    if rt.get("horizon") is not None:
        lines.append(
            f"budget           train.budget_minutes={rt['budget_minutes']:g}: the run ends "
            f"at step ~{rt['horizon']:,} (the trainer fixes it from its own measurement)"
        )
    return lines
