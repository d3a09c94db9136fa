"""The train step on a real DeepSpeed engine in this process (a world of one, gloo): the
device-to-host reads and device synchronisations a step makes are counted, so that the count
stays pinned at the design's one per step (the all-reduce of the step's token counts and
flags); and a step whose loss is not finite leaves the weights and Adam's state as they were,
without DeepSpeed's overflow check."""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from data_pipeline.batching import Batch
from launch.config import load_config
from model.config import ModelConfig
from trainer.dist import DistEnv
from trainer.ds.config import compute_grad_norm_for, norm_every_step, step_guards_update
from trainer.ds.engine import build_engine
from trainer.step import torch_optimizer, train_step

pytestmark = pytest.mark.xdist_group("step_syncs")  # a module-scoped process group: one worker

TINY = [
    "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.encoder_layers=1",
    "model.decoder_layers=1", "model.vocab_size=64", "train.zero_stage=1", "train.grad_accum=2",
]  # fmt: skip

# Tensor methods that read a value back to the host (each a device sync on a GPU).
HOST_READS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
    torch.Tensor.__int__, torch.Tensor.cpu, torch.Tensor.numpy,
}  # fmt: skip


class CountReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads: collections.Counter[str] = collections.Counter()

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        if func in HOST_READS:
            self.reads[func.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def env(rank_env: DistEnv) -> DistEnv:
    return rank_env


def engine_for(env: DistEnv, *over: str) -> Any:
    job = load_config(None, [*TINY, *over])
    torch.manual_seed(0)
    return build_engine(job, ModelConfig(**job.model.__dict__), env)


def batches(seed: int) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        src = torch.randint(4, 64, (4, 8), generator=g)  # (B, S)
        tgt = torch.randint(4, 64, (4, 9), generator=g)  # (B, T + 1)
        out.append(Batch(src, tgt[:, :-1], tgt[:, 1:], n_src_tokens=32, n_tgt_tokens=32))
    return out


def step(engine: Any, env: DistEnv, seed: int, guard: bool = True) -> Any:
    """One step, the previous step's flag on the device as the loop keeps it."""
    flags = torch.zeros(1, device=env.device)
    return train_step(engine, batches(seed), env, 0.1, [False, False], flags, None, guard)


BF16_SUMS = ("train.precision=bf16", "train.grad_accum_dtype=bf16")
# bf16 at ZeRO 1 summing in fp32 (DeepSpeed's BF16_Optimizer) checks the gradient norm on the
# host in every step: one read more, the price of fp32 sums there (trainer/autos.py)
BF16_OPTIMIZER_READS = {"tolist": 1, "__bool__": 1}


@pytest.mark.parametrize(
    "over,reads",
    [(BF16_SUMS, {"tolist": 1}), (("train.precision=bf16",), BF16_OPTIMIZER_READS),
     (("train.precision=bf16", "train.zero_stage=2"), {"tolist": 1}),
     (("train.precision=fp32", "optim.grad_norm=false"), {"tolist": 1})],
    ids=["bf16-bf16-sums", "bf16-zero1-fp32-sums", "bf16-zero2-fp32-sums", "fp32-no-grad-norm"],
)  # fmt: skip
def test_a_step_reads_the_device_once(
    env: DistEnv, over: tuple[str, ...], reads: dict[str, int]
) -> None:
    from deepspeed.accelerator import get_accelerator

    engine = engine_for(env, *over)
    accelerator = get_accelerator()
    synchronize = accelerator.synchronize
    syncs = []
    accelerator.synchronize = lambda *a, **k: syncs.append(1) or synchronize(*a, **k)
    try:
        for seed in range(4):  # DeepSpeed's throughput timer would start syncing at step 2
            counter = CountReads()
            with counter:
                result = step(engine, env, seed)
            assert result.completed
            assert dict(counter.reads) == reads, f"step {seed}: {dict(counter.reads)}"
    finally:
        accelerator.synchronize = synchronize
    assert syncs == []


def test_the_grad_norm_is_computed_on_the_steps_asked_for(env: DistEnv) -> None:
    """fp32, optim.grad_norm on, no clipping: the loop asks for the norm on log steps only. A
    step without it reads the device once (as bf16's); a step with it twice (DeepSpeed checks
    the norm on the host), and only then is there a norm to log. The step guards the update,
    since DeepSpeed's check runs on log steps only; with clipping the norm is computed in every
    step and DeepSpeed's check guards."""
    job = load_config(None, [*TINY, "train.precision=fp32"])
    assert step_guards_update(job.train, job.optim) and not norm_every_step(job.train, job.optim)
    engine = engine_for(env, "train.precision=fp32")
    for seed, on in enumerate((False, True, False)):
        assert compute_grad_norm_for(engine, on)
        counter = CountReads()
        with counter:
            step(engine, env, seed)
        assert sum(counter.reads.values()) == (2 if on else 1), dict(counter.reads)
        norm = engine.get_global_grad_norm()
        assert (norm is not None and math.isfinite(float(norm))) if on else norm is None
    clipped = load_config(None, [*TINY, "train.precision=fp32", "optim.clip_grad=1.0"])
    assert norm_every_step(clipped.train, clipped.optim)
    assert not step_guards_update(clipped.train, clipped.optim)
    # the unfused Adam in fp32: DeepSpeed's check of the norm is the only guard, every step
    unfused = load_config(None, [*TINY, "train.precision=fp32", "optim.fused=false"])
    assert norm_every_step(unfused.train, unfused.optim)
    assert not step_guards_update(unfused.train, unfused.optim)
    bf16 = load_config(None, [*TINY, "train.precision=bf16", "optim.fused=false"])
    assert not norm_every_step(bf16.train, bf16.optim)  # DeepSpeed's overflow check guards


def state(engine: Any) -> list[torch.Tensor]:
    opt = torch_optimizer(engine)
    assert opt is not None
    moments = [t for s in opt.state.values() for t in s.values()]
    return [p.detach().clone() for p in engine.module.parameters()] + [
        t.detach().clone() for t in moments
    ]


@pytest.mark.parametrize(
    "over",
    [("train.precision=bf16",), BF16_SUMS, ("train.precision=fp32",),
     ("train.precision=fp32", "optim.clip_grad=100.0"),
     ("train.precision=fp32", "optim.grad_norm=false"),
     ("train.precision=fp32", "optim.fused=false")],
    ids=["bf16", "bf16-bf16-sums", "fp32", "fp32-clipped", "fp32-no-grad-norm", "fp32-unfused"],
)  # fmt: skip
def test_a_non_finite_step_changes_nothing(env: DistEnv, over: tuple[str, ...]) -> None:
    """Whoever guards the update (the step, or DeepSpeed's norm check in fp32 where the norm
    is computed in every step), as the loop decides it, on a step that logs no norm."""
    job = load_config(None, [*TINY, *over])
    guard = step_guards_update(job.train, job.optim)
    engine = engine_for(env, *over)
    if job.optim.grad_norm and not norm_every_step(job.train, job.optim):
        # BF16_Optimizer (bf16 summing in fp32 at ZeRO 1) computes the norm in every step
        assert compute_grad_norm_for(engine, False) or "BF16" in type(engine.optimizer).__name__
    step(engine, env, 0, guard)
    before = state(engine)
    poison = engine.module.register_forward_hook(
        lambda mod, args, out: (out[0] * float("nan"), *out[1:])
    )
    try:
        result = step(engine, env, 1, guard)  # NaN loss, NaN gradients
    finally:
        poison.remove()
    assert result.completed and not torch.isfinite(result.sums[0])
    after = state(engine)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert getattr(torch_optimizer(engine), "found_inf", None) is None  # one step only
    result = step(engine, env, 2, guard)  # the next finite step trains again
    assert torch.isfinite(result.sums[0])
    later = state(engine)
    assert any(not torch.equal(a, b) for a, b in zip(before, later, strict=True))
    assert all(t.isfinite().all() for t in later)


@pytest.mark.parametrize(
    "stage,accum,dtype",
    [(1, 2, torch.float32), (2, 2, torch.float32), (3, 2, torch.float32),
     (1, 1, torch.bfloat16), (2, 1, torch.bfloat16)],
)  # fmt: skip
def test_bf16_sums_gradients_in_fp32_where_a_step_accumulates(
    env: DistEnv, stage: int, accum: int, dtype: torch.dtype
) -> None:
    """train.grad_accum_dtype auto under bf16: the dtype DeepSpeed's optimizer sums the
    micro-batches' gradients in, as it reads it (ZeRO 1: BF16_Optimizer, whose gradient
    buffer is that dtype; ZeRO 2, 3: the partitions' accumulation dtype)."""
    engine = engine_for(
        env, "train.precision=bf16", f"train.zero_stage={stage}", f"train.grad_accum={accum}"
    )
    opt = engine.optimizer
    if stage == 1 and dtype == torch.float32:
        assert type(opt).__name__ == "BF16_Optimizer"
        assert opt.grad_acc_dtype == dtype
        assert {t.dtype for t in opt.fp32_groups_gradients_flat} == {dtype}
    else:
        assert opt.gradient_accumulation_dtype == dtype
    assert all(p.dtype == torch.bfloat16 for p in engine.module.parameters())
    assert step(engine, env, 0).completed
