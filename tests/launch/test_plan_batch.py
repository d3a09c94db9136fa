"""The planner's micro-batch: the largest that fits the memory model, with the accumulation then
chosen for the step's target (launch/cost_model/plan.py: choose_batch)."""

from __future__ import annotations

import math

import pytest

from launch.cost_model.plan import BATCH_TOLERANCE, Machine, choose_batch, make_plan
from model.config import ModelConfig

BIG = ModelConfig(vocab_size=37000, d_model=1024, n_heads=16, d_ff=4096)
FAIRSEQ_STEP = 458_752  # 3,584 tokens x 16 accumulated x 8 GPUs


def _micro(gpu_mem: float, ranks: int, target: int) -> tuple[int, int]:
    """The recommended (micro_tokens, grad_accum) for the big model."""
    plan = make_plan(BIG, Machine(gpus_per_node=ranks, gpu_mem_gib=gpu_mem), target_tokens=target)
    return plan["micro_tokens"], plan["grad_accum"]


def test_more_memory_per_gpu_takes_a_larger_micro_batch() -> None:
    sizes = [_micro(mem, 8, FAIRSEQ_STEP)[0] for mem in (12.0, 16.0, 24.0, 32.0, 80.0)]
    assert sizes == sorted(sizes)
    assert sizes[0] < sizes[-1] and len(set(sizes)) >= 3
    # one GPU: 80 GiB holds 160k tokens (3 per step), 141 GiB enough for 2 per step
    (m80, a80), (m141, a141) = _micro(80.0, 1, FAIRSEQ_STEP), _micro(141.0, 1, FAIRSEQ_STEP)
    assert m141 > m80 and a141 < a80


def test_fewer_ranks_take_a_larger_micro_batch() -> None:
    """The same step over fewer ranks: each rank's share grows and its memory allows it."""
    (two, _), (eight, _) = _micro(24.0, 2, 25_000), _micro(24.0, 8, 25_000)
    assert two > eight
    assert two == math.ceil(25_000 / 2 / 256) * 256 and eight == math.ceil(25_000 / 8 / 256) * 256


def test_the_largest_micro_batch_is_kept_when_its_step_lands_near_the_target() -> None:
    # 3,072 fit: 3,072 x 1 x 8 = 24,576 is 1.7 % short of 25,000 (shrinking would take 1,792 x 2)
    assert choose_batch(3072, 25_000, 8) == (3072, 1)
    # 26,624 fit: 26,624 x 2 x 8 = 425,984 is 7 % short of the fairseq step
    assert choose_batch(26_624, FAIRSEQ_STEP, 8) == (26_624, 2)


def test_the_micro_batch_is_shrunk_only_when_the_largest_would_miss() -> None:
    # 44,032 fit: x 1 is 23 % short, x 2 is 54 % over; 28,672 x 2 is the step exactly
    assert choose_batch(44_032, FAIRSEQ_STEP, 8) == (28_672, 2)
    # with no tolerance at all the step never falls short of the target
    micro, accum = choose_batch(3072, 25_000, 8, tolerance=0.0)
    assert micro * accum * 8 >= 25_000 and micro < 3072


def test_a_micro_batch_is_never_larger_than_one_steps_share() -> None:
    assert choose_batch(300_000, 25_000, 8) == (3328, 1)
    with pytest.raises(ValueError):
        choose_batch(0, 25_000, 8)


@pytest.mark.parametrize("fit", [256, 1024, 2816, 7936, 26_624, 160_256])
@pytest.mark.parametrize("target", [1, 25_000, 110_592, 458_752])
@pytest.mark.parametrize("world", [1, 3, 8, 64])
def test_choose_batch_rules(fit: int, target: int, world: int) -> None:
    micro, accum = choose_batch(fit, target, world)
    step = micro * accum * world
    share = math.ceil(math.ceil(target / world) / 256) * 256
    largest = min(fit, share)
    assert 0 < micro <= largest and micro % 256 == 0 and accum >= 1
    reaches = step >= target and (micro - 256) * accum * world < target  # no needless overshoot
    if micro == largest:  # kept: one share per rank, a step within the tolerance, or no smaller
        within = abs(step / target - 1) <= BATCH_TOLERANCE  # multiple would reach the target
        assert (accum == 1 and micro == share) or within or reaches
    else:  # shrunk: reaches the target, and the largest would have missed it
        assert reaches
        near = [a for a in (accum - 1, accum) if a >= 1]
        assert all(abs(a * largest * world / target - 1) > BATCH_TOLERANCE for a in near)
