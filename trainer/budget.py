"""Training against a wall-clock budget (`train.budget_minutes`).

A run with a budget measures its step time early (over 5-10 % of the budget after its first
step, `train.budget_calibration_fraction`, and at least `train.budget_calibration_steps` steps;
BudgetClock), times one validation pass and a short decode, and from them fixes the schedule's
horizon once: the last step that, with the evaluations and saves due on the way and
the final ones, ends within the budget. The horizon goes into every checkpoint (`TrainState`),
so a resumed run keeps the same learning-rate curve and stays bitwise; the linear schedule
decays to zero at it (trainer/schedule.py). Time counts from the start of each attempt's
trainer, and what the checkpoint resumed from had spent is carried over; work lost to a crash
after the last checkpoint is not counted.

Should the machine run slower than measured, the run stops where it is once the budget and
`BUDGET_OVERRUN` of it are spent, saying so; the horizon is not moved.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
import torch.distributed as dist

from trainer.config import TrainConfig
from trainer.dist import DistEnv
from trainer.metrics import stderr_warn
from trainer.schedule import Horizon
from trainer.state import TrainState
from trainer.time_costs import BLEU_PROBE_SAMPLES, Cadence, Costs, bleu_seconds, plan_horizon

SKIP_STEPS = 3  # an attempt's first steps, left out of the measurement (allocator, loader start)
BUDGET_OVERRUN = 0.05  # of the budget, past which a run stops before its horizon


class BudgetClock:
    """This rank's view of the budget: time spent (carried over from the checkpoint plus this
    attempt's), and the step-time measurement window, which leaves out the seconds spent
    outside steps (evaluations, saves).

    The window opens once half of `calibration_fraction` of the budget has passed since the
    attempt's first step (and SKIP_STEPS steps are done) and may close once all of it has,
    after `calibration_steps` steps at least: the first seconds of training can be faster than
    the rest (a CPU's boost clock, a loader's full queues) and would make the horizon too far;
    the start-up before the first step is spent but not a step."""

    def __init__(
        self, budget_minutes: float, calibration_steps: int, calibration_fraction: float = 0.0
    ) -> None:
        self.budget_s = 60.0 * budget_minutes
        self.calibration_steps = calibration_steps
        self.fraction = calibration_fraction
        self.attempt_start = time.monotonic()
        self.carried_s = 0.0
        self.first_step = SKIP_STEPS  # the earliest step the window can open after
        self.outside_s = 0.0  # evaluations and saves since the attempt started
        # (step, clock, outside_s) where the window opened
        self.mark: tuple[int, float, float] | None = None
        self.training_from: float | None = None  # spent_s() after the attempt's first step

    @property
    def enabled(self) -> bool:
        return self.budget_s > 0

    def start(self, start_step: int, carried_s: float) -> None:
        """The attempt starts at `start_step`, after `carried_s` spent by the attempts before
        (what the checkpoint it resumed from had spent)."""
        self.first_step = start_step + SKIP_STEPS
        self.carried_s = carried_s

    def spent_s(self) -> float:
        return self.carried_s + time.monotonic() - self.attempt_start

    def over(self) -> bool:
        """Past the budget and its overrun allowance."""
        return self.enabled and self.spent_s() > self.budget_s * (1.0 + BUDGET_OVERRUN)

    @contextmanager
    def outside(self) -> Iterator[None]:
        """Time in this block (an evaluation, a save) is left out of the step-time window."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.outside_s += time.monotonic() - t0

    def training_s(self) -> float:
        """Seconds since the attempt's first step ended."""
        return 0.0 if self.training_from is None else self.spent_s() - self.training_from

    def after_step(self, step: int) -> None:
        """Open the window after `step` when it is time."""
        if self.training_from is None:
            self.training_from = self.spent_s()
        opens = self.training_s() >= 0.5 * self.fraction * self.budget_s
        if self.enabled and self.mark is None and step >= self.first_step and opens:
            self.mark = (step, time.monotonic(), self.outside_s)

    def ready(self, step: int, horizon: Horizon) -> bool:
        """Whether the horizon is to be fixed after `step` (the step about to run); rank 0
        decides and the step's collective tells every rank."""
        if not self.enabled or horizon.total_steps or self.mark is None:
            return False
        measured = step - self.mark[0] >= self.calibration_steps
        return measured and self.training_s() >= self.fraction * self.budget_s

    def measured_step_s(self, step: int) -> float:
        """Seconds per step over the window ending at `step` (evaluations and saves left out);
        0 on a rank whose window has not opened (rank 0's decides)."""
        if self.mark is None or step <= self.mark[0]:
            return 0.0
        first, clock, outside = self.mark
        return (time.monotonic() - clock - (self.outside_s - outside)) / (step - first)


def decay_start(warmup_steps: int, step: int) -> int:
    """The first step of the decay when the horizon is fixed after `step`: the warm-up's end,
    or the step after `step` when the warm-up is already over (the peak held until then)."""
    return max(warmup_steps, step + 1)


def agree_on_costs(costs: Costs, spent_s: float, env: DistEnv) -> tuple[Costs, float]:
    """Every rank's measured costs and time spent, the largest of each kept: every rank then
    fixes the same horizon (from the same numbers), one that the slowest rank can keep to."""
    local = torch.tensor(
        [costs.step_s, costs.eval_s, costs.bleu_s, costs.save_s, spent_s], dtype=torch.float64
    ).to(env.device)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    step_s, eval_s, bleu_s, save_s, spent = local.tolist()
    return Costs(step_s, eval_s, bleu_s, save_s), spent


def horizon_line(budget_minutes: float, step: int, costs: Costs, horizon: Horizon) -> str:
    """The one line that says how the budget fixed the schedule."""
    return (
        f"budget: train.budget_minutes={budget_minutes:g}; measured {costs.step_s:.3f} s per "
        f"step (to step {step}), validation "
        f"{costs.eval_s:.1f} s, BLEU {costs.bleu_s:.1f} s, save {costs.save_s:.1f} s: the run "
        f"ends at step {horizon.total_steps}, the learning rate decaying from step "
        f"{horizon.decay_from}"
    )


class Probe(Protocol):
    """What fixing the horizon times: a validation pass (its metrics are logged) and the
    decoding of `samples` validation sentences."""

    def validation(self) -> dict[str, float]: ...

    def decode(self, samples: int) -> None: ...


def probe_decodes(probe: Probe, large: int) -> tuple[float, int, float, int]:
    """(seconds, sentences) of two decodes, of `large` // 2 and `large` sentences, for
    `bleu_seconds`: what a decode costs whatever its size (a copy of the model, the validation
    stream's start) and what each sentence adds, so that the first is not multiplied with the
    second. With a single sentence to decode, the smaller decode is the empty one (no time)."""

    def timed(n: int) -> float:
        t0 = time.monotonic()
        probe.decode(n)
        return time.monotonic() - t0

    small = large // 2
    t_small = timed(small) if small else 0.0
    return t_small, small, timed(large), large


class Budget:
    """One attempt's budget: its clock, the horizon it fixes in the train state, and whether
    the budget ran out before the horizon."""

    def __init__(
        self, train: TrainConfig, warmup_steps: int, state: TrainState, env: DistEnv
    ) -> None:
        self.cfg, self.warmup_steps, self.state, self.env = train, warmup_steps, state, env
        self.clock = BudgetClock(
            train.budget_minutes, train.budget_calibration_steps, train.budget_calibration_fraction
        )
        self.spent = False  # the budget and its overrun allowance ran out before the horizon

    @property
    def enabled(self) -> bool:
        return self.clock.enabled

    def horizon_for(self, schedule: str) -> Horizon | None:
        """The horizon the scheduler reads: a budget's for the linear schedule, else none
        (the schedule then ends at train.max_steps, or has no end)."""
        return self.state.horizon if self.enabled and schedule == "linear" else None

    def start(self, start_step: int) -> None:
        self.clock.start(start_step, self.state.budget_spent_s)

    def end_step(self) -> int:
        """The run's last step: train.max_steps, or the horizon once fixed."""
        horizon = self.state.horizon.total_steps if self.enabled else 0
        return min(self.cfg.max_steps, horizon) if horizon else self.cfg.max_steps

    def over(self) -> bool:
        return self.clock.over()

    def flags(self, step: int) -> list[bool]:
        """Rank 0's clock, for the collective of `step` (the step about to run): the budget
        is spent; the horizon is to be fixed after this step. Other ranks say no."""
        if not self.env.is_main:
            return [False, False]
        return [self.clock.over(), self.clock.ready(step, self.state.horizon)]

    def before_save(self) -> None:
        self.state.budget_spent_s = self.clock.spent_s()  # in the checkpoint: rank 0's

    def after_step(
        self, step: int, flags: list[bool], probe: Probe, save_s: float, lr: float
    ) -> dict[str, float]:
        """Measure; fix the horizon when rank 0 said so (`flags[1]`, agreed by all ranks;
        returns the probe's validation metrics and the horizon, for the step's record); or end
        the run once the budget is spent (`flags[0]`), saying so with the lr it ends at."""
        over, calibrate = flags
        if not self.enabled:
            return {}
        self.clock.after_step(step)
        if calibrate and not self.state.horizon.total_steps:
            return self.fix(step, probe, save_s)
        if over and step < self.end_step():
            self.spent = True
            if self.env.is_main:
                stderr_warn(self.spent_line(step, lr))
        return {}

    def fix(self, step: int, probe: Probe, save_s: float) -> dict[str, float]:
        """Fix the horizon at `step` from the measured step time and the probe's timings."""
        env = self.env
        step_s = self.clock.measured_step_s(step)
        with self.clock.outside():
            t0 = time.monotonic()
            record = probe.validation()
            eval_s = time.monotonic() - t0
            bleu_s = self.time_bleu(probe)
        costs, spent = agree_on_costs(
            Costs(step_s, eval_s, bleu_s, save_s), self.clock.spent_s(), env
        )
        cadence = Cadence(self.cfg.eval_every, self.cfg.bleu_every, self.cfg.save_every)
        left = self.clock.budget_s - spent
        horizon = self.state.horizon
        horizon.total_steps = plan_horizon(step, left, costs, cadence, self.cfg.max_steps)
        horizon.decay_from = decay_start(self.warmup_steps, step)
        if env.is_main:
            print(horizon_line(self.cfg.budget_minutes, step, costs, horizon), flush=True)
        return {**record, "horizon": float(horizon.total_steps)}

    def time_bleu(self, probe: Probe) -> float:
        """Seconds for a BLEU of train.bleu_samples sentences (`probe_decodes`)."""
        wanted = self.cfg.bleu_samples
        return bleu_seconds(*probe_decodes(probe, min(BLEU_PROBE_SAMPLES, wanted)), wanted)

    def spent_line(self, step: int, lr: float) -> str:
        horizon = self.state.horizon.total_steps or "not fixed yet"
        return (
            f"train.budget_minutes={self.cfg.budget_minutes:g} spent at step {step}, before "
            f"the schedule's end at step {horizon}: the run ends here with lr {lr:.3g}"
        )

    def summary(self) -> dict[str, float | int | None]:
        """The run summary's budget figures (none without a budget)."""
        if not self.enabled:
            return {}
        spent = round(self.clock.spent_s(), 1)
        return {"horizon": self.state.horizon.total_steps or None, "budget_spent_s": spent}
