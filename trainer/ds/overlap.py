"""ZeRO 0: gradients all-reduced bucket by bucket while the backward still runs, as torch's DDP
does it.

DeepSpeed reduces a ZeRO 0 engine's gradients only after the backward has finished
(`engine.allreduce_gradients`, called at the end of `engine.backward` at an accumulation
boundary), so the whole reduction adds to the step. Here each parameter's gradient, once the
last micro-batch of a step has added to it, marks its bucket ready (a post-accumulate-grad
hook); a full bucket is copied into one flat buffer and its all-reduce starts asynchronously
while autograd computes the gradients of earlier layers. Every rank starts the buckets in the
same order, bucket 0 first (a bucket that is ready waits for the ones before it), as a
collective's order must agree across ranks. At the end of the backward the engine's own
reduction is replaced by: start the buckets not yet started (a parameter without a gradient
gives zeros, as DeepSpeed does), wait for each and copy the averaged gradients back.

The arithmetic is DeepSpeed's (`allreduce_bucket`): the same sum and the same scaling, so the
gradients are the same as after the backward's end at two ranks, bit for bit. Buckets hold
`train.bucket_elements` elements of one dtype, filled in the reverse of the model's parameter
order (the order the backward produces gradients in, roughly: the last layers first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass(eq=False)
class Bucket:
    params: list[torch.nn.Parameter]
    waiting: int = 0  # parameters whose gradient is not final yet in this backward
    flat: torch.Tensor | None = None  # (sum of the params' numel,) while its reduction runs
    work: Any = None  # the reduction in flight (dist.Work)


def buckets_of(params: list[torch.nn.Parameter], elements: int) -> list[Bucket]:
    """Parameters in reverse order, cut into buckets of one dtype and at most `elements`
    elements each (a parameter larger than that is a bucket of its own)."""
    out: list[Bucket] = []
    open_by_dtype: dict[torch.dtype, Bucket] = {}
    sizes: dict[torch.dtype, int] = {}
    for p in reversed(params):
        bucket = open_by_dtype.get(p.dtype)
        if bucket is None or sizes[p.dtype] + p.numel() > elements:
            bucket = open_by_dtype[p.dtype] = Bucket([])
            sizes[p.dtype] = 0
            out.append(bucket)
        bucket.params.append(p)
        sizes[p.dtype] += p.numel()
    return out


@dataclass(eq=False)
class BackwardAllReduce:
    """Installed on a ZeRO 0 engine by `reduce_during_backward`; see the module's doc."""

    engine: Any
    buckets: list[Bucket]
    group: Any = None
    world_size: int = 1
    started: int = 0  # buckets started in this backward, in order
    bucket_of: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, bucket in enumerate(self.buckets):
            bucket.waiting = len(bucket.params)
            for p in bucket.params:
                self.bucket_of[id(p)] = i
                p.register_post_accumulate_grad_hook(self.gradient_ready)

    def gradient_ready(self, param: torch.Tensor) -> None:
        """A parameter's gradient has been accumulated; final at an accumulation boundary."""
        if not self.engine.is_gradient_accumulation_boundary():
            return
        self.buckets[self.bucket_of[id(param)]].waiting -= 1
        while self.started < len(self.buckets) and self.buckets[self.started].waiting == 0:
            self.start(self.buckets[self.started])

    def start(self, bucket: Bucket) -> None:
        grads = []
        for p in bucket.params:
            if p.grad is None:  # not used in this step's graph: zeros, as DeepSpeed gives it
                p.grad = torch.zeros_like(p)
            grads.append(p.grad.reshape(-1))  # (numel,)
        flat = torch.cat(grads)  # (sum of numel,)
        comm_dtype = self.engine.communication_data_type
        bucket.flat = flat if comm_dtype == flat.dtype else flat.to(comm_dtype)
        post = self.engine.postscale_gradients()
        if self.engine.gradient_average and not post:
            bucket.flat.mul_(1.0 / self.world_size)
        elif self.engine.gradient_average and self.engine.gradient_predivide_factor() != 1.0:
            bucket.flat.mul_(1.0 / self.engine.gradient_predivide_factor())
        bucket.work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        self.started += 1

    def finish(self, bucket_size: int | None = None) -> None:
        """In place of DeepSpeed's `engine.allreduce_gradients`, at the end of each backward."""
        if not self.engine.is_gradient_accumulation_boundary():
            return
        while self.started < len(self.buckets):
            self.start(self.buckets[self.started])
        predivide = self.engine.gradient_predivide_factor()
        for bucket in self.buckets:
            bucket.work.wait()
            flat = bucket.flat
            assert flat is not None
            post = self.engine.gradient_average and self.engine.postscale_gradients()
            if post and predivide != self.world_size:
                flat.mul_(predivide / self.world_size)
            offset = 0
            for p in bucket.params:
                n = p.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n
            bucket.flat, bucket.work, bucket.waiting = None, None, len(bucket.params)
        self.started = 0


def reduce_during_backward(engine: Any, bucket_elements: int) -> BackwardAllReduce:
    """Make a ZeRO 0 engine reduce its gradients during the backward (module doc)."""
    params = [p for p in engine.module.parameters() if p.requires_grad and p.numel() > 0]
    group = engine.seq_data_parallel_group
    world = dist.get_world_size(group)
    reducer = BackwardAllReduce(engine, buckets_of(params, bucket_elements), group, world)
    engine.allreduce_gradients = reducer.finish  # the engine calls it after each backward
    return reducer
