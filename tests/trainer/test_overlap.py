"""ZeRO 0's reduction during the backward (trainer/ds/overlap.py) on a real DeepSpeed engine in
this process (a world of one, gloo): buckets start while autograd still computes gradients,
in the same order every time, and the step's gradients and losses are DeepSpeed's own
(reduced after the backward) bit for bit, with accumulation, in fp32 and bf16. The two-rank
sums are covered by tests/integration/test_zero_stages.py (ZeRO 0 trains with small buckets
there and exports the tensors ZeRO 2 and 3 do)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.trainer.test_step_syncs import batches, engine_for
from trainer.dist import DistEnv
from trainer.ds.overlap import BackwardAllReduce, buckets_of, reduce_during_backward

pytestmark = pytest.mark.xdist_group("step_syncs")  # the session's process group: one worker

# the step-sync tests' tiny model, deeper, at ZeRO 0 and without dropout
OVER = ("model.encoder_layers=2", "model.decoder_layers=2", "model.dropout=0.0",
        "train.zero_stage=0")  # fmt: skip
BUCKET = 3000  # elements: the tiny model (~30k parameters) in about ten buckets


def steps(engine: Any, n: int) -> tuple[list[float], list[torch.Tensor]]:
    """`n` optimizer steps; their losses and the last step's reduced gradients."""
    losses, grads = [], []
    for seed in range(n):
        for batch in batches(seed):
            loss, _, _ = engine(batch.src, batch.tgt_in, batch.tgt_out, 0.1)
            engine.backward(loss)
            grads = [p.grad.clone() for p in engine.module.parameters()]
            engine.step()
            losses.append(loss.item())
    return losses, grads


def test_buckets_follow_the_reverse_parameter_order_by_dtype_and_size() -> None:
    params = [
        torch.nn.Parameter(torch.zeros(n, dtype=dtype))
        for n, dtype in [(5, torch.float32), (4, torch.bfloat16), (3, torch.float32),
                         (9, torch.float32), (2, torch.float32)]
    ]  # fmt: skip
    buckets = buckets_of(params, 6)
    assert [[p.numel() for p in b.params] for b in buckets] == [[2], [9], [3], [4], [5]]
    buckets = buckets_of(params, 20)
    assert [[p.numel() for p in b.params] for b in buckets] == [[2, 9, 3, 5], [4]]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_buckets_start_during_the_backward_and_give_deepspeeds_gradients(
    rank_env: DistEnv, precision: str
) -> None:
    over = (*OVER, f"train.precision={precision}", f"train.bucket_elements={BUCKET}")
    plain = engine_for(rank_env, *over)  # a world of one: build_engine installs nothing
    assert not isinstance(getattr(plain.allreduce_gradients, "__self__", None), BackwardAllReduce)
    overlapped = engine_for(rank_env, *over)
    reducer = reduce_during_backward(overlapped, BUCKET)
    assert len(reducer.buckets) >= 8
    order: list[tuple[int, int]] = []  # (bucket, parameters whose gradient is not final yet)
    start = reducer.start

    def start_and_note(bucket: Any) -> None:
        order.append((reducer.buckets.index(bucket), sum(b.waiting for b in reducer.buckets)))
        start(bucket)

    reducer.start = start_and_note  # type: ignore[method-assign]
    want_losses, want_grads = steps(plain, 3)
    got_losses, got_grads = steps(overlapped, 3)

    n = len(reducer.buckets)
    assert [i for i, _ in order] == list(range(n)) * 3  # each step, in order, once each
    # the first bucket starts while most gradients are still to come
    params = sum(len(b.params) for b in reducer.buckets)
    assert all(pending > params // 2 for i, pending in order if i == 0), order
    assert got_losses == want_losses
    for got, want in zip(got_grads, want_grads, strict=True):
        assert torch.equal(got, want)
