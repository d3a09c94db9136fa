"""The loop's log window and agreed flags, by name (trainer/step.py), on a world of one."""

from __future__ import annotations

import torch

from trainer.dist import DistEnv
from trainer.step import LogWindow, LoopFlags, WindowTotals


def test_a_window_sums_steps_by_name_and_starts_again(rank_env: DistEnv) -> None:
    window = LogWindow(rank_env.device)
    window.add(torch.tensor([2.0, 1.5, 10.0, 9.0], dtype=torch.float64), 100.0, 0.25)
    window.add(torch.tensor([1.0, 0.5, 5.0, 4.0], dtype=torch.float64), 50.0, 0.5)
    totals = window.reduce([3.0, 1.0])
    assert totals == WindowTotals(
        loss=3.0, nll=2.0, tgt_tokens=15.0, src_tokens=13.0, flops=150.0, data_s=0.75,
        skipped_long=3.0, skipped_corrupt=1.0, steps=2,
    )  # fmt: skip
    assert window.steps == 0 and window.flops == 0.0 and window.data_s == 0.0
    assert not window.sums.any()


def test_the_agreed_flags_by_name() -> None:
    flags = LoopFlags.of([True, False, True, False, True, True])
    assert flags == LoopFlags(
        stop=True, save_due=False, checks=True, budget=[False, True], prev_nonfinite=True
    )
    assert LoopFlags.of([False, True, False, False]).budget == []
    assert LoopFlags.of([False, False, True, False])[LoopFlags.CHECKS] is True
