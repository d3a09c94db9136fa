"""Training FLOPs of the encoder-decoder Transformer and the peak FLOP/s of a device, for MFU.

MFU (model FLOPs utilisation) = (training FLOPs of the tokens processed per second) /
(peak FLOP/s of all devices). Counting FLOPs from the model's shapes, not from a profiler,
makes the figure comparable across machines and precisions (PaLM, appendix B).

FLOPs of one training step (forward + backward = 3 x forward; a multiply-add is 2 FLOPs):

    F = 6 * N_enc * src_tokens                       encoder matmuls
      + 6 * (N_dec + V * d) * tgt_tokens             decoder matmuls + output projection
      + 12 * d * L_enc * sum_src(S)                  encoder self-attention (QK^T and AV)
      + 12 * d * L_dec * sum_tgt(T)                  decoder self-attention
      + 12 * d * L_dec * sum_tgt(S)                  decoder cross-attention

where N_enc / N_dec are the non-embedding parameters of the encoder / decoder stacks, V * d
is the output projection (tied to the embedding, counted once: the embedding lookup itself is
no matmul), S and T are the padded source and target lengths of the micro-batch a token is in,
and sum_src(S) = src_tokens * S of that micro-batch. The attention term is the usual
6 * n_layers * 2 * d_model * seq per token, with the full (not causally halved) score matrix,
as SDPA computes it. Cross-attention's K/V projections run over source positions; they are
counted per target token with the rest of the decoder (a small overestimate when T < S).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from model.config import ModelConfig
from model.params import count_parameters

if TYPE_CHECKING:  # torch is imported where it is used: `paperscale plan` runs without it
    import torch


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: dense peak FLOP/s, compute capability, memory, and where the figures are
    from. `half` is the 16-bit tensor-core rate (bf16 where the GPU has it, else fp16), `single`
    the fp32 rate (TF32 tensor cores where the GPU has them). Datasheets quote 16-bit and TF32
    rates "with sparsity" for Ampere and newer: the dense figure is half of that."""

    key: str  # matched by substring of torch.cuda.get_device_name(), case-insensitive
    half: float
    single: float
    capability: tuple[int, int]
    memory_gib: float
    source: str


# First match wins, so longer names come first.
GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("GH200", 989e12, 494.5e12, (9, 0), 96, "NVIDIA GH200 datasheet (2023)"),
    GpuSpec("H200", 989e12, 494.5e12, (9, 0), 141, "NVIDIA H200 datasheet, SXM (2024)"),
    GpuSpec("H100 PCIe", 756e12, 378e12, (9, 0), 80, "NVIDIA H100 datasheet, PCIe (2023)"),
    GpuSpec("H100", 989e12, 494.5e12, (9, 0), 80, "NVIDIA H100 datasheet, SXM (2023)"),
    GpuSpec("H800", 989e12, 494.5e12, (9, 0), 80, "NVIDIA H800 brief (2023): H100 SXM rates"),
    GpuSpec("B200", 2250e12, 1100e12, (10, 0), 180, "NVIDIA DGX B200 datasheet (2024), per GPU"),
    GpuSpec("A100", 312e12, 156e12, (8, 0), 80, "NVIDIA A100 datasheet (2021)"),
    GpuSpec("A800", 312e12, 156e12, (8, 0), 80, "NVIDIA A800 brief (2022): A100 rates"),
    GpuSpec("L40S", 362e12, 183e12, (8, 9), 48, "NVIDIA L40S datasheet (2023)"),
    GpuSpec("A10", 125e12, 62.5e12, (8, 6), 24, "NVIDIA A10 datasheet (2021)"),
    GpuSpec("L40", 181e12, 90.5e12, (8, 9), 48, "NVIDIA L40 datasheet (2022)"),
    GpuSpec("L4", 121e12, 60e12, (8, 9), 24, "NVIDIA L4 datasheet (2023)"),
    GpuSpec("RTX 4090", 165e12, 82.6e12, (8, 9), 24, "NVIDIA Ada whitepaper v1.0, fp32 accum."),
    GpuSpec("RTX 3090", 71e12, 35.6e12, (8, 6), 24, "NVIDIA GA102 whitepaper, fp32 accum."),
    GpuSpec("V100", 125e12, 15.7e12, (7, 0), 32, "NVIDIA V100 datasheet, SXM2 (2020): fp16"),
    GpuSpec("T4", 65e12, 8.1e12, (7, 5), 16, "NVIDIA T4 datasheet (2019): fp16"),
    GpuSpec("P100", 21.2e12, 10.6e12, (6, 0), 16, "NVIDIA P100 datasheet, SXM2 (2016): fp16"),
)


def gpu_spec(device_name: str) -> GpuSpec | None:
    """The table's entry for a CUDA device name (e.g. 'NVIDIA H200', 'v100'), or None."""
    for spec in GPU_SPECS:
        if spec.key.lower() in device_name.lower():
            return spec
    return None


def step_flops(
    cfg: ModelConfig, src_tokens: int, tgt_tokens: int, src_len: int, tgt_len: int
) -> float:
    """Training FLOPs (forward + backward) of one micro-batch; see the module docstring.

    src_tokens / tgt_tokens are the non-pad tokens; src_len / tgt_len the padded lengths S, T.
    """
    params = count_parameters(cfg)
    d = cfg.d_model
    assert cfg.vocab_size is not None
    matmul = 6.0 * (
        params["encoder"] * src_tokens + (params["decoder"] + cfg.vocab_size * d) * tgt_tokens
    )
    attention = (
        12.0 * d * cfg.encoder_layers * src_tokens * src_len
        + 12.0 * d * cfg.decoder_layers * tgt_tokens * (tgt_len + src_len)
    )
    return matmul + attention


def flops_per_token(cfg: ModelConfig, src_len: int, tgt_len: int) -> float:
    """Training FLOPs per (source + target) token of a batch of equal-length, unpadded pairs."""
    return step_flops(cfg, src_len, tgt_len, src_len, tgt_len) / (src_len + tgt_len)


def gpu_peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """The table's peak for a CUDA device name, or None for a device not in the table."""
    import torch

    spec = gpu_spec(device_name)
    if spec is None:
        return None
    return spec.half if dtype in (torch.bfloat16, torch.float16) else spec.single


def largest_matmuls(cfg: ModelConfig, rows: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of the largest matrix products of a training step with `rows` tokens per
    micro-batch and side: the output projection (rows, d) @ (d, V) and its weight gradient
    (d, rows) @ (rows, V), and the feed-forward block's (rows, d) @ (d, d_ff) and
    (rows, d_ff) @ (d_ff, d) (the largest where the vocabulary is small). Rows are capped at
    2,048 to bound the probe's cost; products that large already run at the full matmul rate.
    """
    assert cfg.vocab_size is not None
    m, d, f, v = max(64, min(rows, 2048)), cfg.d_model, cfg.d_ff, cfg.vocab_size
    return [(m, d, v), (d, m, v), (m, d, f), (m, f, d)]


@functools.cache
def measured_cpu_peak_flops(
    dtype: torch.dtype, shapes: tuple[tuple[int, int, int], ...], reps: int = 3,
    budget_s: float = 1.0,
) -> float:  # fmt: skip
    """FLOP/s of this process's CPU threads on the best of `shapes`' matmuls in `dtype`.

    CPUs have no datasheet figure that means anything for a process (cores, threads, AVX-512,
    AMX and the other processes on the machine differ), so the peak is measured: each shape
    is warmed up, then timed as the best of `reps` calls (fewer when `budget_s` runs out; at
    least one). Run it on every rank at the same time, so that each measures its share of the
    cores it trains on; cached per process.
    """
    import torch

    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        torch.mm(a[: min(m, 64)], b)  # warm-up (kernel choice, allocations), small and cheap
        seconds = float("inf")
        start = time.perf_counter()
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.mm(a, b)
            seconds = min(seconds, time.perf_counter() - t0)
            if time.perf_counter() - start >= budget_s / len(shapes):
                break
        best = max(best, 2.0 * m * k * n / seconds)
    return best


def peak_flops(
    device: torch.device, dtype: torch.dtype, cfg: ModelConfig, rows: int
) -> float | None:
    """Peak FLOP/s of one rank: the table for CUDA (None for a GPU not in it), a measured
    matmul at the model's largest shapes on CPU (`rows` tokens per micro-batch and side)."""
    import torch

    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), dtype)
    return measured_cpu_peak_flops(dtype, tuple(largest_matmuls(cfg, rows)))
