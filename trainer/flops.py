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

import torch

from model.config import ModelConfig
from model.params import count_parameters

# Dense peak FLOP/s per device for 16-bit (bf16 / fp16) tensor-core math; fp32 uses the
# second figure (TF32 where the device has it). Matched by substring of the device name,
# first match wins, so longer names come first.
GPU_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989e12, 494.5e12),
    ("H100 PCIe", 756e12, 378e12),
    ("H100", 989e12, 494.5e12),
    ("GH200", 989e12, 494.5e12),
    ("B200", 2250e12, 1100e12),
    ("A100", 312e12, 156e12),
    ("A800", 312e12, 156e12),
    ("H800", 989e12, 494.5e12),
    ("L40S", 362e12, 183e12),
    ("A10G", 70e12, 35e12),
    ("A10", 125e12, 62.5e12),
    ("L40", 181e12, 90.5e12),
    ("L4", 121e12, 60e12),
    ("RTX 4090", 165e12, 82.6e12),
    ("RTX 3090", 71e12, 35.6e12),
    ("V100", 125e12, 15.7e12),
    ("T4", 65e12, 8.1e12),
    ("P100", 21.2e12, 10.6e12),
)


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
    for key, half, single in GPU_PEAKS:
        if key.lower() in device_name.lower():
            return half if dtype in (torch.bfloat16, torch.float16) else single
    return None


@functools.cache
def measured_cpu_peak_flops(dtype: torch.dtype, size: int = 256, seconds: float = 0.2) -> float:
    """FLOP/s of a square matmul in `dtype` on this process's CPU threads, measured once.

    CPUs have no table entry that means anything (cores, threads, AMX/AVX-512 differ), so the
    'peak' is what this process reaches on a dense matmul; cached so that it costs ~0.2 s once.
    """
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)  # warm-up
    reps, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * size**3 * reps / elapsed


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Peak FLOP/s of one device: the table for CUDA, a measured matmul on CPU."""
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), dtype)
    return measured_cpu_peak_flops(dtype)
