"""Grouping a step's profiled ops (trainer/step_time.py), without a profiler: names and regions
as torch.profiler reports them."""

from __future__ import annotations

import pytest

from trainer.step_time import (
    ATTENTION,
    COMMUNICATION,
    DATA_WAIT,
    ELEMENTWISE,
    GROUPS,
    HOST,
    LOSS,
    MATMUL,
    OPTIMIZER,
    REGION_BACKWARD,
    REGION_DATA,
    REGION_FORWARD,
    REGION_LOSS,
    REGION_OPTIMIZER,
    OpTime,
    format_table,
    group_of,
    step_times,
)

FWD = ("ProfilerStep#7", REGION_FORWARD)
BWD = ("ProfilerStep#7", REGION_BACKWARD, "autograd::engine::evaluate_function: AddmmBackward0")


@pytest.mark.parametrize(
    ("op", "group"),
    [
        (OpTime("aten::addmm", 1, FWD), MATMUL),
        (OpTime("aten::mm", 1, BWD), MATMUL),
        (OpTime("aten::bmm", 1, (*FWD, "aten::_scaled_dot_product_attention_math")), ATTENTION),
        (OpTime("aten::_scaled_dot_product_flash_attention_for_cpu", 1, FWD), ATTENTION),
        (OpTime("aten::_softmax", 1, (*FWD, "aten::scaled_dot_product_attention")), ATTENTION),
        (OpTime("aten::native_layer_norm", 1, FWD), ELEMENTWISE),
        (OpTime("aten::bernoulli_", 1, FWD), ELEMENTWISE),
        (OpTime("aten::copy_", 1, BWD), ELEMENTWISE),
        (OpTime("aten::_log_softmax", 1, (*FWD, REGION_LOSS)), LOSS),
        (OpTime("aten::mm", 1, (*FWD, REGION_LOSS)), MATMUL),  # the output projection
        (OpTime("aten::_fused_adam_", 1, ("ProfilerStep#7", REGION_OPTIMIZER)), OPTIMIZER),
        (OpTime("aten::copy_", 1, ("ProfilerStep#7", REGION_OPTIMIZER)), OPTIMIZER),
        (OpTime("c10d::allreduce_", 1, ("ProfilerStep#7", REGION_OPTIMIZER)), COMMUNICATION),
        (OpTime("gloo:all_reduce", 1, ("ProfilerStep#7",)), COMMUNICATION),
        (OpTime(REGION_DATA, 1, ("ProfilerStep#7",)), DATA_WAIT),
        (OpTime("aten::empty", 1, ("ProfilerStep#7", REGION_DATA)), DATA_WAIT),
        (OpTime("autograd::engine::evaluate_function: MmBackward0", 1, BWD), HOST),
        (OpTime("sm90_xmma_gemm_bf16bf16_bf16f32", 1, FWD), MATMUL),  # a CUDA kernel's name
    ],
)
def test_each_op_lands_in_its_group(op: OpTime, group: str) -> None:
    assert group_of(op) == group


def test_groups_add_up_to_the_wall_time_and_host_is_the_rest() -> None:
    ops = [
        OpTime("aten::mm", 30_000, FWD),
        OpTime("aten::mm", 10_000, BWD),
        OpTime("aten::add", 5_000, FWD),
        OpTime("aten::_log_softmax", 6_000, (*FWD, REGION_LOSS)),
        OpTime("aten::_fused_adam_", 4_000, ("ProfilerStep#7", REGION_OPTIMIZER)),
        OpTime("autograd::engine::evaluate_function: MmBackward0", 999, BWD),
        OpTime(REGION_DATA, 1_000, ("ProfilerStep#7",)),
    ]
    times = step_times(ops, steps=2, wall_us=100_000)  # 2 steps of 50 ms
    assert times.step_ms == 50.0
    assert times.groups[MATMUL] == 20.0 and times.groups[ELEMENTWISE] == 2.5
    assert times.groups[LOSS] == 3.0 and times.groups[OPTIMIZER] == 2.0
    assert times.groups[DATA_WAIT] == 0.5
    assert times.groups[HOST] == pytest.approx(50.0 - 28.0)  # the autograd wrapper and the gaps
    assert sum(times.groups.values()) == pytest.approx(times.step_ms)
    assert list(times.groups) == list(GROUPS)
    assert times.top_ops[MATMUL] == [("aten::mm", 20.0)]
    assert times.share(MATMUL) == pytest.approx(0.4)


def test_host_never_negative_and_table_lists_every_group() -> None:
    times = step_times([OpTime("aten::mm", 2_000, FWD)], steps=1, wall_us=1_000)
    assert times.groups[HOST] == 0.0
    table = format_table([times, times], "title")
    assert table.splitlines()[0] == "title"
    for group in GROUPS:
        assert any(line.startswith(group) for line in table.splitlines())
    assert "rank 1" in table and "aten::mm 2.0" in table
