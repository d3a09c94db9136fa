"""One optimizer step and the figures it reports (host-side FLOPs, optimizer state)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.profiler import record_function

from data_pipeline.loader import Batch, TokenBatchStream
from model.config import ModelConfig
from trainer.dist import DistEnv
from trainer.flops import step_flops
from trainer.step_time import REGION_BACKWARD, REGION_DATA, REGION_FORWARD, REGION_OPTIMIZER


@dataclass
class StepResult:
    """What one call of `train_step` did: this rank's sums, the flags OR-ed over the ranks
    (host flags first, then device flags) and whether the optimizer step was taken."""

    sums: torch.Tensor  # (4,) float64 on device: loss, nll, target tokens, source tokens
    flags: list[bool]
    completed: bool
    micro_batches_run: int = 0  # of an incomplete step: 0 = skipped, else abandoned after


class LoopFlags(NamedTuple):
    """The loop's flags of one step as every rank agreed them in the step's collective (the
    order `Trainer.step` passes them to `train_step`: host flags, then the device flag)."""

    stop: bool  # a stop request (a signal) on some rank
    save_due: bool  # train.save_every_minutes elapsed on rank 0
    checks: bool  # whether to agree after each micro-batch on abandoning (trainer/signals.py)
    budget: list[bool]  # trainer/budget.py's flags
    prev_nonfinite: bool  # the previous step's loss was not finite on some rank

    CHECKS = 2  # the index of `checks` among the flags

    @classmethod
    def of(cls, agreed: list[bool]) -> LoopFlags:
        stop, save_due, checks, *budget, prev_nonfinite = agreed
        return cls(stop, save_due, checks, budget, prev_nonfinite)


def train_step(
    engine: Any,
    batches: list[Batch],
    env: DistEnv,
    epsilon: float,
    flags: list[bool],
    device_flags: torch.Tensor | None = None,
    abandon: Callable[[int, bool], bool] | None = None,
    guard: bool = True,
    checks: int | None = None,
) -> StepResult:
    """One optimizer step over `batches` (the accumulation micro-batches of this rank).

    The gradient is that of (sum of token losses over all ranks and micro-batches) / (target
    tokens of the whole step), as in fairseq; DeepSpeed averages over ranks and divides by the
    accumulation count, which the factor `world * accum / tokens` undoes. The one all-reduce
    that counts the step's tokens also carries this rank's host `flags` (the first: a stop
    request) and `device_flags` (e.g. the previous step's loss was not finite, still on the
    device), so every rank acts on them at the same step; its result is the step's one
    device-to-host sync. Padding decisions come from the batches' host metadata.
    A stop request agreed there skips the step; `abandon(i, check)` (all ranks call it after
    micro-batch i, before the last, `check` being the agreed host flag at index `checks`; it
    must agree across ranks) drops the step in flight before the optimizer update. Either way
    `completed` is False and the engine's weights and optimizer are those of the last finished
    step. `guard`: the step keeps a non-finite loss from updating (trainer/ds/config.py
    `step_guards_update`; false where DeepSpeed checks itself).
    """
    host = torch.tensor([sum(b.n_tgt_tokens for b in batches), *map(float, flags)])
    counts = host.to(env.device, torch.float64, non_blocking=True)
    if device_flags is not None:
        counts = torch.cat([counts, device_flags.to(torch.float64)])
    dist.all_reduce(counts)
    global_tokens, *reduced = counts.tolist()
    agreed = [flag > 0 for flag in reduced]
    # loss, nll, target tokens, source tokens: the last known on the host, so it travels with
    # the copy (a scalar written into a device tensor later would synchronise the device)
    src_tokens = float(sum(b.n_src_tokens for b in batches))
    sums = torch.tensor([0.0, 0.0, 0.0, src_tokens], dtype=torch.float64)
    sums = sums.to(env.device, non_blocking=True)
    if flags and agreed[0]:
        return StepResult(sums, agreed, completed=False)
    check = checks is None or agreed[checks]
    factor = env.world_size * len(batches) / max(global_tokens, 1.0)
    for i, batch in enumerate(batches):
        batch = batch.to(env.device, non_blocking=True)
        with record_function(REGION_FORWARD):
            loss, nll, ntok = engine(
                batch.src, batch.tgt_in, batch.tgt_out, epsilon, src_padded=batch.src_padded
            )
        with record_function(REGION_BACKWARD):
            engine.backward(loss * factor)
        if abandon is not None and i < len(batches) - 1 and abandon(i, check):
            return StepResult(sums, agreed, completed=False, micro_batches_run=i + 1)
        sums[:3] += torch.stack([loss.detach(), nll.detach(), ntok.detach()]).double()
        guarded = guard_update(engine, sums) if guard and i == len(batches) - 1 else None
        with record_function(REGION_OPTIMIZER):
            engine.step()
        if guarded is not None:
            guarded.found_inf = None  # type: ignore[attr-defined]  # for this update only
    return StepResult(sums, agreed, completed=True)


def torch_optimizer(engine: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside DeepSpeed's wrappers (ZeRO's, bf16's), or None."""
    opt = getattr(engine, "optimizer", None)
    for _ in range(4):
        if isinstance(opt, torch.optim.Optimizer):
            return opt
        opt = getattr(opt, "optimizer", None)
    return None


def guard_update(engine: Any, sums: torch.Tensor) -> torch.optim.Optimizer | None:
    """Before the step's update: where torch's fused Adam runs (trainer/ds/config.py
    `skips_nonfinite_steps`), give it `found_inf`, 1.0 when the step's loss was not finite on
    some rank, so that the update, Adam's moments and its step count stay as they were. One
    one-element all-reduce on the device, no host read (DeepSpeed's own overflow check, which
    costs a norm per gradient and a host read, is off then). The learning-rate schedule still
    advances; the loop counts the step as non-finite (train.max_nonfinite)."""
    opt = torch_optimizer(engine)
    if opt is None or not opt.defaults.get("fused"):
        return None
    bad = (~torch.isfinite(sums[0])).to(torch.float32)  # () as Adam takes it
    if dist.get_world_size() > 1:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    opt.found_inf = bad  # type: ignore[attr-defined]  # read by Adam.step (fused)
    return opt


def nonfinite_flag(sums: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """1.0 on the device where the previous step's loss (`sums[0]`) was not finite; no sync."""
    if sums is None:
        return torch.zeros(1, dtype=torch.float64, device=device)
    return (~torch.isfinite(sums[:1])).to(torch.float64)


def loss_finite_everywhere(sums: torch.Tensor, env: DistEnv) -> bool:
    """Whether the step's loss (`sums[0]`, this rank's) is finite on every rank."""
    bad = (~torch.isfinite(sums[:1])).double()
    dist.all_reduce(bad)
    return bool(bad.item() == 0)


def batch_flops(model_cfg: ModelConfig, batches: list[Batch]) -> float:
    """Training FLOPs of this rank's micro-batches, from host-side shapes (no device sync)."""
    return sum(
        step_flops(
            model_cfg,
            b.n_src_tokens,
            b.n_tgt_tokens,
            int(b.src.shape[1]),
            int(b.tgt_out.shape[1]),
        )
        for b in batches
    )


def optimizer_metrics(engine: Any, precision: str) -> dict[str, float]:
    """Gradient norm of the step just taken and, under fp16, the dynamic loss scale.

    DeepSpeed returns None for the norm where its optimizer does not compute one; then the
    key is left out (it is for the whole run, since that depends on the stage only).
    """
    out: dict[str, float] = {}
    norm = engine.get_global_grad_norm()
    if norm is not None:
        out["grad_norm"] = float(norm)
    if precision == "fp16":
        opt = engine.optimizer
        scale = getattr(opt, "cur_scale", None) or getattr(opt, "loss_scale", None)
        if scale is not None:
            out["loss_scale"] = float(scale)
        # optimizer steps skipped because of fp16 overflow, since the start of this process
        out["overflow_skipped_steps"] = float(getattr(engine, "skipped_steps", 0))
    return out


def skipped_counts(stream: TokenBatchStream) -> list[float]:
    """This rank's cumulative (too long, corrupt) skipped-sample counters."""
    stats = stream.stats()
    return [float(stats["samples_skipped_long"]), float(stats["samples_skipped_corrupt"])]


class WindowTotals(NamedTuple):
    """The steps of a log window summed over all ranks (`LogWindow.reduce`)."""

    loss: float  # sum of the label-smoothed token losses
    nll: float  # sum of the token negative log-likelihoods
    tgt_tokens: float  # real (unpadded) target tokens
    src_tokens: float
    flops: float  # training FLOPs (trainer/flops.py's count)
    data_s: float  # seconds the ranks waited for their micro-batches (summed over ranks)
    skipped_long: float  # samples the loader skipped so far: too long
    skipped_corrupt: float  # and unreadable
    steps: int  # steps in the window (each rank's; the same on all)

    def rates(self, seconds: float, world_size: int, peak: float) -> dict[str, float]:
        """The window's loss, speeds and data wait over `seconds` of wall time (MFU against
        the ranks' `peak` FLOP/s, when known)."""
        tgt, src = self.tgt_tokens, self.src_tokens
        out = {
            "loss": self.loss / tgt,
            "ppl": math.exp(min(self.nll / tgt, 50.0)),
            "src_tokens_per_s": src / seconds,
            "tgt_tokens_per_s": tgt / seconds,
            "tokens_per_s": (src + tgt) / seconds,
            "tgt_tokens_per_step": tgt / self.steps,  # real (unpadded) target tokens, all ranks
            "data_wait_pct": 100.0 * self.data_s / world_size / seconds,
            "samples_skipped_long": int(self.skipped_long),
            "samples_skipped_corrupt": int(self.skipped_corrupt),
        }
        return out | ({"mfu": self.flops / seconds / peak} if peak else {})


def take_batches(batches: Iterator[Batch], n: int) -> tuple[list[Batch], float]:
    """A step's `n` micro-batches and the seconds spent waiting for them: summed per log window
    into `data_wait_pct`, the share of it the ranks waited (docs/data.md)."""
    start = time.perf_counter()
    with record_function(REGION_DATA):
        micro = [next(batches) for _ in range(n)]
    return micro, time.perf_counter() - start


class LogWindow:
    """This rank's sums of the steps since the last log step: the step's sums (StepResult.sums
    on the device, no sync per step) and its FLOPs (on the host)."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)  # as StepResult.sums
        self.flops = 0.0
        self.data_s = 0.0
        self.steps = 0

    def add(self, sums: torch.Tensor, flops: float, data_s: float = 0.0) -> None:
        self.sums += sums
        self.flops += flops
        self.data_s += data_s
        self.steps += 1

    def reduce(self, skipped: list[float]) -> WindowTotals:
        """The window over all ranks, with the loader's skip counters (one all-reduce, one
        host sync); then empty again."""
        extra = [self.flops, self.data_s, *skipped]
        extra_t = torch.tensor(extra, dtype=torch.float64, device=self.sums.device)
        reduced = torch.cat([self.sums, extra_t])  # (8,): sums, FLOPs, data wait, skip counters
        dist.all_reduce(reduced)
        totals = WindowTotals(*reduced.tolist(), steps=self.steps)
        self.sums.zero_()
        self.flops, self.data_s, self.steps = 0.0, 0.0, 0
        return totals
