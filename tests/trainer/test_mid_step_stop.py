"""A stop request in the middle of a step: the ranks agree after each micro-batch whether to
abandon it only in steps too long to finish and still save within train.stop_grace_s; the
agreement to check travels in the step's one collective (trainer/signals.py MidStepStop)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trainer.dist import DistEnv
from trainer.signals import MidStepStop, StopRequest
from trainer.step import LoopFlags, train_step

pytestmark = pytest.mark.xdist_group("step_syncs")  # the module-scoped process group's worker


def test_checks_are_needed_only_where_a_stop_could_not_wait_for_the_step() -> None:
    mid = MidStepStop(StopRequest(), grace_s=30.0, margin_s=5.0, group=None)
    assert not mid.needed(save_s=1.0, micro_batches=1)  # nothing to abandon between
    assert mid.needed(save_s=1.0, micro_batches=4)  # the first step: its length unknown
    for _ in range(3):
        mid.step_took(0.5)
    assert not mid.needed(save_s=1.0, micro_batches=4)  # 2 x 0.5 + 1 + 5 < 30
    assert mid.needed(save_s=24.0, micro_batches=4)  # a slow save leaves too little
    mid.step_took(12.0)  # one long step among the recent ones
    assert mid.needed(save_s=1.0, micro_batches=4)  # 2 x 12 + 1 + 5 >= 30
    for _ in range(8):  # ... until it is no longer among the last 8
        mid.step_took(0.5)
    assert not mid.needed(save_s=1.0, micro_batches=4)


def test_a_step_passes_the_agreed_flag_to_every_micro_batch_hook(rank_env: DistEnv) -> None:
    """train_step calls the hook after each micro-batch but the last with the agreed flag at
    index `checks`, whatever its value: the hook (the loop's fault seam and abandonment) sees
    every boundary, and agrees with the other ranks only where the flag says so."""
    from launch.config import load_config
    from model.config import ModelConfig
    from tests.trainer.test_step_syncs import TINY, batches
    from trainer.ds.engine import build_engine

    job = load_config(None, [*TINY, "train.precision=fp32", "train.grad_accum=3"])
    torch.manual_seed(0)
    engine = build_engine(job, ModelConfig(**job.model.__dict__), rank_env)
    for checks in (False, True):
        seen: list[tuple[int, bool]] = []

        def hook(i: int, check: bool, seen: list[Any] = seen) -> bool:
            seen.append((i, check))
            return False

        micro = batches(0) + batches(1)[:1]  # three micro-batches
        flags = [False, False, checks, False]  # stop, save due, checks, previous non-finite
        result = train_step(engine, micro, rank_env, 0.1, flags, None, hook, True, LoopFlags.CHECKS)
        assert result.completed and LoopFlags.of(result.flags).checks == checks
        assert seen == [(0, checks), (1, checks)]
