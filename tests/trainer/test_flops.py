"""FLOPs per token and device peaks for MFU."""

from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig
from model.params import count_parameters
from trainer.flops import (
    GPU_SPECS,
    flops_per_token,
    gpu_peak_flops,
    gpu_spec,
    largest_matmuls,
    measured_cpu_peak_flops,
    peak_flops,
    step_flops,
)


def test_step_flops_by_hand_for_a_one_layer_model() -> None:
    cfg = ModelConfig(
        vocab_size=10, d_model=4, n_heads=2, d_ff=8, encoder_layers=1, decoder_layers=1
    )
    d, f, v = 4, 8, 10
    attn, ffn, norm = 4 * (d * d + d), d * f + f + f * d + d, 2 * d
    n_enc, n_dec = attn + ffn + 2 * norm, 2 * attn + ffn + 3 * norm
    src, tgt, s_len, t_len = 5, 3, 6, 4
    expected = (
        6 * n_enc * src
        + 6 * (n_dec + v * d) * tgt
        + 12 * d * src * s_len  # encoder self-attention
        + 12 * d * tgt * t_len  # decoder self-attention
        + 12 * d * tgt * s_len  # cross-attention
    )
    assert step_flops(cfg, src, tgt, s_len, t_len) == pytest.approx(expected)


def test_base_model_is_about_six_n_per_token_plus_attention() -> None:
    cfg = ModelConfig(vocab_size=37000)  # the paper's base model
    p = count_parameters(cfg)
    n = p["encoder"] + p["decoder"] + p["embeddings"]  # non-embedding + output projection once
    per_token = flops_per_token(cfg, 30, 30)
    # Encoder params see only source tokens, decoder + output only target tokens: with equal
    # lengths that is 6 * N / 2 per token, plus a small attention term.
    assert 3 * n < per_token < 3 * n * 1.05


def test_longer_sequences_cost_more_per_token() -> None:
    cfg = ModelConfig(vocab_size=37000)
    assert flops_per_token(cfg, 256, 256) > flops_per_token(cfg, 16, 16)


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H200", torch.bfloat16, 989e12),
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989e12),
        ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312e12),
        ("NVIDIA A100-SXM4-80GB", torch.float32, 156e12),
        ("Tesla V100-SXM2-32GB", torch.float16, 125e12),
        ("Tesla P100-PCIE-16GB", torch.float16, 21.2e12),
    ],
)
def test_gpu_peak_table(name: str, dtype: torch.dtype, peak: float) -> None:
    assert gpu_peak_flops(name, dtype) == peak


def test_unknown_gpu_has_no_peak() -> None:
    assert gpu_peak_flops("Some Future Accelerator", torch.bfloat16) is None


def test_every_gpu_entry_names_its_source_and_capability() -> None:
    for spec in GPU_SPECS:
        assert spec.source.strip() and spec.half >= spec.single > 0
        assert spec.capability >= (6, 0) and spec.memory_gib > 0
    assert gpu_spec("tesla v100-sxm2-16gb") is not None
    assert gpu_spec("Tesla V100-SXM2-16GB").capability == (7, 0)  # type: ignore[union-attr]


def test_cpu_peak_covers_the_models_largest_matmuls() -> None:
    cfg = ModelConfig(vocab_size=8000, d_model=256, d_ff=1024)
    shapes = largest_matmuls(cfg, rows=1536)
    biggest = max(m * k * n for m, k, n in shapes)
    assert biggest == 1536 * 256 * 8000  # the output projection
    assert (1536, 256, 1024) in shapes and (1536, 1024, 256) in shapes  # feed-forward
    assert max(m for m, _, _ in largest_matmuls(cfg, rows=100_000)) == 2048  # capped


def test_cpu_peak_is_measured_once_per_dtype_and_shape() -> None:
    cfg = ModelConfig(vocab_size=64, d_model=32, d_ff=64)
    shapes = tuple(largest_matmuls(cfg, rows=128))
    first = measured_cpu_peak_flops(torch.float32, shapes)
    assert first > 1e6
    assert measured_cpu_peak_flops(torch.float32, shapes) == first  # cached, not re-measured
    assert peak_flops(torch.device("cpu"), torch.float32, cfg, 128) == first
