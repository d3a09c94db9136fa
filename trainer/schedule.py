"""Learning-rate schedules: the paper's (linear warm-up, then inverse square root), and a linear
warm-up then linear decay to zero at the end of training (`optim.schedule: linear`), the robust
choice when the run's length is known in advance (Li, Yumer and Ramanan, "Budgeted Training",
ICLR 2020; fairseq's polynomial_decay with power 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Horizon:
    """Where the linear decay ends: its last step (0 while a budgeted run has not fixed it yet:
    warm-up, then the peak held) and its first (the warm-up's end unless fixed later).
    Mutable on purpose: a budgeted run fixes it once, and the scheduler reads it at each step."""

    total_steps: int = 0
    decay_from: int = 0


def peak_lr(d_model: int, warmup_steps: int) -> float:
    """The paper's peak, reached at step = warmup: d_model^-0.5 * warmup^-0.5."""
    return d_model**-0.5 * warmup_steps**-0.5


def inverse_sqrt_lr(
    step: int,
    *,
    d_model: int,
    warmup_steps: int,
    lr: float | None = None,
    warmup_init_lr: float = 0.0,
) -> float:
    """Learning rate of optimizer step `step` (1-based).

    With `lr=None` and `warmup_init_lr=0` this is the paper's
    d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); `lr` sets the peak instead (fairseq's
    inverse_sqrt with --lr), and `warmup_init_lr` the start of the linear warm-up.
    """
    peak = peak_lr(d_model, warmup_steps) if lr is None else lr
    step = max(step, 1)
    if step < warmup_steps:
        return warmup_init_lr + (peak - warmup_init_lr) * step / warmup_steps
    return peak * math.sqrt(warmup_steps / step)


def linear_decay_lr(
    step: int,
    *,
    peak: float,
    warmup_steps: int,
    total_steps: int,
    warmup_init_lr: float = 0.0,
    decay_from: int = 0,
) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warm-up to `peak` at
    `warmup_steps`, the peak held until `decay_from` (default: the warm-up's end), then linear
    decay that would reach zero at step `total_steps + 1` (so the last step still moves the
    weights: peak / (total - decay_from + 1)). `total_steps` 0: not known yet, the peak held."""
    step = max(step, 1)
    if step < warmup_steps:
        return warmup_init_lr + (peak - warmup_init_lr) * step / warmup_steps
    start = max(decay_from, warmup_steps)
    if total_steps == 0 or step < start:
        return peak
    left = total_steps + 1 - step
    return peak * max(left, 0) / (total_steps + 1 - start)


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    d_model: int,
    warmup_steps: int,
    lr: float | None,
    warmup_init_lr: float,
    schedule: str = "inverse_sqrt",
    total_steps: int | None = None,
    horizon: Horizon | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR on base lr 1.0 whose k-th optimizer step (k = 1, 2, ...) uses lr(k):
    `inverse_sqrt` (the paper's) or `linear` (decay to zero after `total_steps`, or after the
    `horizon` a budgeted run fixes while it trains; its peak is `lr`, or the paper's peak for
    d_model and warm-up when `lr` is None).

    LambdaLR evaluates its lambda at 0 on construction and after each step() at 1, 2, ...;
    shifting by one makes the first update use lr(1) rather than the useless lr(0) = 0.
    """
    for group in optimizer.param_groups:
        group["lr"] = 1.0
        group["initial_lr"] = 1.0
    if schedule == "linear":
        if horizon is None:
            if total_steps is None or total_steps < warmup_steps:
                raise ValueError(
                    f"linear decay needs total_steps >= warmup_steps, got {total_steps}"
                )
            horizon = Horizon(total_steps, warmup_steps)
        peak, fixed = (peak_lr(d_model, warmup_steps) if lr is None else lr), horizon

        def linear(completed_steps: int) -> float:
            return linear_decay_lr(completed_steps + 1, peak=peak, warmup_steps=warmup_steps,
                                   total_steps=fixed.total_steps, warmup_init_lr=warmup_init_lr,
                                   decay_from=fixed.decay_from)  # fmt: skip

        return torch.optim.lr_scheduler.LambdaLR(optimizer, linear)

    def factor(completed_steps: int) -> float:
        return inverse_sqrt_lr(
            completed_steps + 1,
            d_model=d_model,
            warmup_steps=warmup_steps,
            lr=lr,
            warmup_init_lr=warmup_init_lr,
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
