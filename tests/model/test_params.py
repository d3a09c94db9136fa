"""The closed-form parameter count matches the built model, and the paper's sizes."""

from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig
from model.params import count_parameters
from model.transformer import Transformer

from .conftest import tiny_config

BASE = dict(vocab_size=37000)
BIG = dict(vocab_size=37000, d_model=1024, n_heads=16, d_ff=4096)


def built_counts(cfg: ModelConfig) -> dict[str, int]:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = Transformer(cfg)
    total = sum(p.numel() for p in model.parameters())  # parameters() dedups the shared E
    return {
        "total": total,
        "embeddings": model.embed.weight.numel(),
        "encoder": sum(p.numel() for p in model.encoder.parameters()),
        "decoder": sum(p.numel() for p in model.decoder.parameters()),
    }


@pytest.mark.parametrize(
    "cfg",
    [
        tiny_config(),
        tiny_config(pre_norm=True),
        ModelConfig(**BASE),
        ModelConfig(**BIG),
    ],
    ids=["tiny", "tiny-pre-ln", "base", "big"],
)
def test_closed_form_equals_built_model(cfg: ModelConfig) -> None:
    assert count_parameters(cfg) == built_counts(cfg)


def test_paper_sizes() -> None:
    base = count_parameters(ModelConfig(**BASE))["total"]
    big = count_parameters(ModelConfig(**BIG))["total"]
    assert base == 63_082_496
    assert big == 214_245_376
    assert abs(base - 65e6) / 65e6 < 0.05
    assert abs(big - 213e6) / 213e6 < 0.05


def test_one_shared_embedding_without_output_bias() -> None:
    model = Transformer(tiny_config())
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes.count((40, 16)) == 1
    assert model.embed.weight[0].abs().sum() == 0  # PAD row
