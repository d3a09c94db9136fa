"""The planner: memory per rank for each ZeRO stage, micro-batch x accumulation, time per step.

Pure functions of the config's shapes and a few machine figures; nothing here starts a process
or touches a device. `paperscale plan` (launch/cmd_plan.py) prints `make_plan`'s result with the
step time model of launch/cost_model/speed.py and the time to a BLEU of
launch/cost_model/quality.py.

Memory of the model states (per rank, Psi parameters, N data-parallel ranks) follows the ZeRO
paper's accounting as DeepSpeed 0.19 allocates it for bf16/fp16 mixed precision: 16-bit
parameters (2 Psi) and gradients (2 Psi), plus K = 12 bytes per parameter of optimizer state
(fp32 master weights, Adam m and v):

    stage 0   2 Psi + 2 Psi + 12 Psi          (DeepSpeed's bf16/fp16 optimizer wrapper)
    stage 1   2 Psi + 2 Psi + 12 Psi / N      optimizer states partitioned
    stage 2   2 Psi + (2 + 12) Psi / N        gradients too
    stage 3   (2 + 2 + 12) Psi / N            parameters too (+ small parameters kept whole)

fp32 training has no master copy at stage 0 (4 + 4 + 8 bytes), while ZeRO 1-3 still keep an fp32
partition beside the fp32 parameters (4 + 4 + 12). bf16 summing micro-batches' gradients in fp32
(train.grad_accum_dtype): stage 1's BF16_Optimizer adds a whole fp32 gradient buffer (2 + 4 Psi),
stages 2 and 3 keep fp32 gradient partitions (4 Psi / N). Buffers (train.bucket_elements): ZeRO
1/2 fill a contiguous 16-bit reduce bucket during backward, two with train.overlap_comm
(released after it); ZeRO 3 keeps its reduce bucket for the engine's lifetime and gathers up to
a bucket of parameters ahead of their use. Module buffers (the position table) count too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from launch.cost_model.activations import (
    activation_bytes,
    loss_workspace_bytes,
    per_token_bytes,
    projection_copy_bytes,
)
from launch.cost_model.comm import Interconnect
from launch.cost_model.step_time import step_time
from model.config import LossChunking, ModelConfig, loss_chunking
from model.params import count_parameters

GIB = 2**30
STAGES = (0, 1, 2, 3)
# Peak dense bf16 matmul FLOP/s of one H200 as measured (the data sheet says 989e12 dense).
H200_BF16_MEASURED = 790e12
# CUDA context, cuBLAS workspaces and NCCL buffers: memory a rank never gets for tensors.
RUNTIME_RESERVE_BYTES = 1 * GIB
TOKEN_MULTIPLE = 256  # micro-batch sizes are searched in steps of this many tokens
# How far a step of the largest micro-batches may land from the target before the micro-batch
# is shrunk to meet it: at 1-4 micro-batches per step one more or one fewer moves the step by
# 25 % or more, which would change the recipe the target stands for.
BATCH_TOLERANCE = 0.1


@dataclass(frozen=True)
class Buckets:
    """DeepSpeed bucket sizes in elements and overlap_comm (trainer/ds/config.py)."""

    reduce: int
    allgather: int
    prefetch: int
    persistence_threshold: int
    overlap: bool = False


@dataclass(frozen=True)
class Machine:
    """What the plan is for: ranks, memory per rank and the assumed speed."""

    nodes: int = 1
    gpus_per_node: int = 8
    gpu_mem_gib: float = 80.0
    headroom: float = 0.1  # fraction of gpu_mem kept free (allocator fragmentation)
    mfu: float = 0.4
    peak_flops: float = H200_BF16_MEASURED
    overhead_s: float = 0.0  # per optimizer step, beyond the matmuls (launch/cost_model/speed.py)
    overhead_micro_s: float = 0.0  # per micro-batch, beyond its matmuls
    on_cpu: bool = False  # CPU ranks (a calibrated CPU): the loss is cut as a CPU's
    # GPU links for the gradients' synchronisation (launch/cost_model/comm.py); None: not priced
    links: Interconnect | None = None
    comm_bytes: int = 2  # bytes a parameter's gradient is communicated in (bf16/fp16; fp32: 4)
    buckets: Buckets | None = None  # train.bucket_elements, train.overlap_comm (None: defaults)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    def loss_chunking(self) -> LossChunking:
        """How the trainer cuts the loss on these ranks (model.config.loss_chunking)."""
        return loss_chunking(None if self.on_cpu else self.gpu_mem_gib * GIB)

    def usable_bytes(self) -> float:
        """Bytes per rank the planner may fill: gpu_mem less headroom and the runtime."""
        return self.gpu_mem_gib * GIB * (1.0 - self.headroom) - RUNTIME_RESERVE_BYTES


def ds_buckets(train: Any = None) -> Buckets:
    """The bucket sizes trainer/ds/config.py gives DeepSpeed for `train` (a TrainConfig; the
    defaults without one)."""
    from trainer.config import TrainConfig

    train = train or TrainConfig()
    n = int(train.bucket_elements)
    return Buckets(n, n, n, 100_000, bool(train.overlap_comm))


def precision_bytes(precision: str) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter at ZeRO 1-3."""
    if precision == "fp32":
        return 4, 4, 12
    return 2, 2, 12


def persistent_numel(cfg: ModelConfig, threshold: int) -> int:
    """Parameters ZeRO 3 keeps whole on every rank: tensors of at most `threshold` elements
    (biases, LayerNorms, and any weight matrix that small)."""
    d, f = cfg.d_model, cfg.d_ff
    attn = [d * d, d] * 4
    ffn = [d * f, f, f * d, d]
    norm = [d, d]
    tensors = (
        cfg.encoder_layers * (attn + ffn + 2 * norm)
        + cfg.decoder_layers * (2 * attn + ffn + 3 * norm)
        + ([d, d] * 2 if cfg.pre_norm else [])
    )
    assert cfg.vocab_size is not None
    tensors.append(cfg.vocab_size * d)
    return sum(n for n in tensors if n <= threshold)


def module_buffer_bytes(cfg: ModelConfig) -> int:
    """The fp32 sinusoidal position table (max_positions x d_model), on every rank."""
    return cfg.max_positions * cfg.d_model * 4


def model_state_bytes(
    n_params: int,
    stage: int,
    world: int,
    precision: str = "bf16",
    buckets: Buckets | None = None,
    persistent: int = 0,
    fp32_sums: bool = False,
) -> dict[str, float]:
    """Per-rank bytes: params, grads, optimizer, buffers (bucket peak), total. `fp32_sums`:
    gradients summed in fp32 under bf16 (see the module).

    `persistent` is the number of parameters ZeRO 3 keeps whole (see `persistent_numel`).
    `buffers` holds the bucket memory at its peak during a step; `resident` is what stays
    allocated between steps (params + grads + optimizer + persistent buckets).
    """
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be 0-3, got {stage}")
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    buckets = buckets or ds_buckets()
    p_b, g_b, o_b = precision_bytes(precision)
    if stage == 0 and precision == "fp32":
        o_b = 8  # Adam m, v; the fp32 parameters are the master weights
    half = 2 if precision != "fp32" else 4  # bucket element size (the gradient dtype)
    psi = float(n_params)
    params = p_b * psi if stage < 3 else p_b * (psi / world + persistent)
    grads = g_b * psi if stage < 2 else g_b * psi / world
    if fp32_sums and precision == "bf16" and stage > 0:
        grads = (g_b + 4) * psi if stage == 1 else 4 * psi / world
    optimizer = o_b * psi if stage == 0 else o_b * psi / world
    resident_buffers = 0.0
    if stage in (1, 2):  # contiguous reduce buckets, during backward (two with overlap_comm)
        transient = half * buckets.reduce * (2 if buckets.overlap else 1)
    elif stage == 3:
        resident_buffers = half * buckets.reduce  # kept for the engine's lifetime
        transient = half * min(buckets.prefetch, psi)  # parameters gathered ahead of use
    else:  # ZeRO 0: flat gradient buckets, all in flight with overlap; else DeepSpeed's 5e8
        transient = half * (psi if buckets.overlap else min(500_000_000, psi))
    return {
        "params": params,
        "grads": grads,
        "optimizer": optimizer,
        "buffers": resident_buffers + transient,
        "resident": params + grads + optimizer + resident_buffers,
        "total": params + grads + optimizer + resident_buffers + transient,
    }


def largest_micro_batch(
    cfg: ModelConfig,
    state_bytes: float,
    usable_bytes: float,
    precision: str = "bf16",
    checkpointing: bool = False,
    multiple: int = TOKEN_MULTIPLE,
    cap: int | None = None,
    compiled: bool = False,
    chunking: LossChunking | None = None,
) -> int:
    """Largest multiple of `multiple` tokens per side whose activations fit beside the model
    states in `usable_bytes` (0 when not even one multiple fits); at most `cap` if given. The
    loss's work space is counted at its bound under `chunking` (a CPU's when None)."""
    fixed = loss_workspace_bytes(cfg, precision, compiled, chunking)
    fixed += projection_copy_bytes(cfg, precision, checkpointing)
    free = usable_bytes - state_bytes - fixed
    per_token = per_token_bytes(cfg, precision, checkpointing, compiled)
    if free <= 0:
        return 0
    tokens = int(free // per_token) // multiple * multiple
    if cap is not None:
        tokens = min(tokens, math.ceil(cap / multiple) * multiple)
    return tokens


def accumulation_steps(target_tokens: int, micro_tokens: int, world: int) -> int:
    """Fewest micro-batches per rank and step with accum * micro * world >= target."""
    if micro_tokens <= 0:
        raise ValueError("micro-batch must be > 0 tokens")
    return max(1, math.ceil(target_tokens / (micro_tokens * world)))


def choose_batch(
    fit: int,
    target_tokens: int,
    world: int,
    tolerance: float = BATCH_TOLERANCE,
    multiple: int = TOKEN_MULTIPLE,
) -> tuple[int, int]:
    """(micro_tokens, grad_accum) on ranks that fit `fit` tokens per micro-batch (> 0).

    The micro-batch is the largest that fits, up to the rank's share of one step (a larger one
    would overshoot the target in a single micro-batch): fewer, larger micro-batches launch
    fewer kernels per token and, at ZeRO 2, reduce gradients fewer times per step. The
    accumulation is then the count whose step lands nearest the target (on a log scale). Only
    when that step misses the target by more than `tolerance` is the micro-batch shrunk: to
    the smallest multiple that reaches the target in the fewest accumulation steps.
    """
    if fit <= 0:
        raise ValueError("micro-batch must be > 0 tokens")
    share = math.ceil(math.ceil(target_tokens / world) / multiple) * multiple
    micro = min(fit, share)
    if micro == share:
        return micro, 1
    ratio = target_tokens / (micro * world)  # > 1: micro < share
    low, high = math.floor(ratio), math.ceil(ratio)
    accum = low if ratio / low <= high / ratio else high
    if abs(accum * micro * world / target_tokens - 1) <= tolerance:
        return micro, accum
    need = math.ceil(target_tokens / (high * world))
    return math.ceil(need / multiple) * multiple, high


def stage_plan(
    cfg: ModelConfig,
    stage: int,
    machine: Machine,
    target_tokens: int,
    precision: str = "bf16",
    checkpointing: bool = False,
    buckets: Buckets | None = None,
    compiled: bool = False,
    tolerance: float = BATCH_TOLERANCE,
    sums: str = "auto",
) -> dict[str, float | int | bool]:
    """One stage's memory, micro-batch and accumulation on `machine`.

    `max_micro_tokens` is the largest micro-batch that fits; `micro_tokens` and `grad_accum`
    are `choose_batch`'s for the target. `sums` is train.grad_accum_dtype: `auto` sums in fp32
    under bf16 where the batch chosen accumulates (trainer/autos.py), and is planned so.
    """
    from trainer.config import sums_in_fp32  # the engine's own rule

    buckets, n_params = buckets or machine.buckets or ds_buckets(), count_parameters(cfg)["total"]
    persistent = persistent_numel(cfg, buckets.persistence_threshold) if stage == 3 else 0
    chunking = machine.loss_chunking()

    def fitted(fp32_sums: bool) -> tuple[dict[str, float], int, int, int]:
        states = model_state_bytes(
            n_params, stage, machine.world, precision, buckets, persistent, fp32_sums
        )
        states["buffers"] += module_buffer_bytes(cfg)
        states["total"] += module_buffer_bytes(cfg)
        fit = largest_micro_batch(
            cfg, states["total"], machine.usable_bytes(), precision, checkpointing,
            compiled=compiled, chunking=chunking,
        )  # fmt: skip
        micro, accum = choose_batch(fit, target_tokens, machine.world, tolerance) if fit else (0, 0)
        return states, fit, micro, accum

    fp32_sums = sums_in_fp32(sums, precision, 1, stage)  # `auto`: as if nothing accumulates
    states, fit, micro, accum = fitted(fp32_sums)
    if not fp32_sums and sums_in_fp32(sums, precision, accum, stage):  # the batch accumulates
        fp32_sums = True
        states, fit, micro, accum = fitted(fp32_sums)
    out: dict[str, float | int | bool] = {"stage": stage, **states}
    out.update(fits=fit > 0, max_micro_tokens=fit, micro_tokens=micro)
    out["activations"] = activation_bytes(cfg, micro, precision, checkpointing, compiled, chunking)
    out["grad_accum"] = accum
    out["fp32_sums"] = fp32_sums
    out["peak"] = states["total"] + out["activations"]
    return out


def recommend_stage(stages: list[dict[str, float | int | bool]]) -> int | None:
    """The smallest stage that reaches the fewest accumulation steps (None if none fits).

    Lower stages communicate less; a higher one is only worth it when the memory it frees
    allows a larger micro-batch and so fewer accumulation steps.
    """
    fitting = [s for s in stages if s["fits"]]
    if not fitting:
        return None
    fewest = min(int(s["grad_accum"]) for s in fitting)
    return min(int(s["stage"]) for s in fitting if int(s["grad_accum"]) == fewest)


def _chosen_stage(
    cfg: ModelConfig,
    machine: Machine,
    chosen: dict[str, float | int | bool],
    max_steps: int,
    checkpointing: bool,
    seq_len: int,
    fill: float,
) -> dict:
    """The recommended stage's batch, FLOPs, step and total time, and its overrides."""
    tokens = int(chosen["micro_tokens"]) * int(chosen["grad_accum"]) * machine.world
    accum = int(chosen["grad_accum"])
    step = step_time(cfg, machine, tokens, seq_len, checkpointing, fill, accum,
                     int(chosen["stage"]))  # fmt: skip
    return {
        "micro_tokens": chosen["micro_tokens"],
        "max_micro_tokens": chosen["max_micro_tokens"],
        "grad_accum": chosen["grad_accum"],
        "tokens_per_step_per_side": tokens,
        "flops_per_step": step["flops"],
        "mfu": machine.mfu,
        "peak_tflops": machine.peak_flops / 1e12,
        "overhead_s": step["overhead_s"],
        "comm_s": step["comm_s"],
        "comm_bytes": step["comm_bytes"],
        "comm_link": step["comm_link"],
        "fill": fill,
        "compute_s": step["compute_s"],
        "step_s": step["step_s"],
        "max_steps": max_steps,
        "total_hours": step["step_s"] * max_steps / 3600,
        "overrides": [
            f"train.zero_stage={chosen['stage']}",
            f"data.max_tokens={chosen['micro_tokens']}",
            f"train.grad_accum={chosen['grad_accum']}",
        ],
    }


def make_plan(
    cfg: ModelConfig,
    machine: Machine,
    target_tokens: int = 25_000,
    max_steps: int = 100_000,
    precision: str = "bf16",
    checkpointing: bool = False,
    seq_len: int = 32,
    buckets: Buckets | None = None,
    compiled: bool = False,
    tolerance: float = BATCH_TOLERANCE,
    fill: float = 1.0,
    sums: str = "auto",
) -> dict:
    """Everything `paperscale plan` prints.

    `target_tokens` is per side: the paper's ~25k source and ~25k target tokens per step.
    Micro-batches are padded tokens per side, as `data.max_tokens` counts them. FLOPs count
    the step's target_tokens on both sides at padded length `seq_len` (trainer/flops.py).
    `compiled` is `train.compile`: the loss is then the compiler's fused one, whose logits
    grow with the micro-batch, instead of the chunked one (launch/cost_model/activations.py).
    `tolerance` is how far the step may land from the target (`choose_batch`); `fill` the
    share of a micro-batch's token budget its batches hold, which the step time counts.
    """
    if target_tokens < 1:
        raise ValueError("target tokens must be >= 1")
    args = (target_tokens, precision, checkpointing, buckets, compiled, tolerance, sums)
    stages = [stage_plan(cfg, s, machine, *args) for s in STAGES]
    best = recommend_stage(stages)
    out: dict = {
        "params": count_parameters(cfg),
        "world": machine.world,
        "gpu_mem_gib": machine.gpu_mem_gib,
        "usable_gib": machine.usable_bytes() / GIB,
        "precision": precision,
        "activation_checkpointing": checkpointing,
        "compiled": compiled,
        "target_tokens_per_side": target_tokens,
        "batch_tolerance": tolerance,
        "stages": stages,
        "recommended_stage": best,
    }
    if best is not None:
        chosen = _chosen_stage(cfg, machine, stages[best], max_steps, checkpointing, seq_len, fill)
        out.update(chosen)
    return out
