"""The initial weights follow fairseq's Transformer (torch.nn.MultiheadAttention's packed Q/K/V,
torch's default feed-forward Linear), the init under which the demo recipe learns as fairseq's
run of it does (bench/peer_fairseq.py); a per-(D, D) xavier Q/K/V is the regression."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from model.config import PAD_ID, ModelConfig
from model.transformer import Transformer

D, FF = 256, 1024


def model(**overrides: object) -> Transformer:
    torch.manual_seed(0)
    cfg = dict(vocab_size=512, d_model=D, n_heads=4, d_ff=FF, encoder_layers=2, decoder_layers=2)
    cfg.update(overrides)
    return Transformer(ModelConfig(**cfg))  # type: ignore[arg-type]


def uniform_std(bound: float) -> float:
    return bound / math.sqrt(3)


def weights(m: Transformer, suffix: str) -> list[torch.Tensor]:
    return [p.detach() for n, p in m.named_parameters() if n.endswith(suffix)]


def test_qkv_are_drawn_like_torch_multihead_attentions_packed_in_projection() -> None:
    m = model()
    ref = nn.MultiheadAttention(D, 4)  # in_proj_weight (3D, D), xavier-uniform as one matrix
    ref_bound = math.sqrt(6 / (D + 3 * D))
    assert ref.in_proj_weight.abs().max() <= ref_bound
    for name in ("q_proj.weight", "k_proj.weight", "v_proj.weight"):
        ws = weights(m, name)
        assert len(ws) == 2 + 2 * 2  # encoder self, decoder self and cross attention
        for w in ws:
            assert w.shape == (D, D)
            assert w.abs().max() <= ref_bound
            assert w.std().item() == pytest.approx(ref.in_proj_weight.std().item(), rel=0.03)


def test_output_and_feed_forward_projections_and_biases() -> None:
    m = model()
    for w in weights(m, "out_proj.weight"):
        assert w.std().item() == pytest.approx(uniform_std(math.sqrt(6 / (2 * D))), rel=0.03)
    for w in weights(m, "ffn.linear1.weight"):  # (FF, D): torch's default U(+-1/sqrt(D))
        assert w.abs().max() <= 1 / math.sqrt(D)
        assert w.std().item() == pytest.approx(uniform_std(1 / math.sqrt(D)), rel=0.03)
    for w in weights(m, "ffn.linear2.weight"):  # (D, FF): U(+-1/sqrt(FF)), 2.2x below xavier
        assert w.abs().max() <= 1 / math.sqrt(FF)
        assert w.std().item() == pytest.approx(uniform_std(1 / math.sqrt(FF)), rel=0.03)
    biases = [p for n, p in m.named_parameters() if n.endswith("bias") and "norm" not in n]
    assert biases and all(bool((b == 0).all()) for b in biases)
    e = m.embed.weight.detach()
    assert bool((e[PAD_ID] == 0).all())
    assert e[PAD_ID + 1 :].std().item() == pytest.approx(D**-0.5, rel=0.03)


def test_init_std_overrides_every_projection() -> None:
    m = model(init_std=0.02)
    for suffix in ("q_proj.weight", "out_proj.weight", "ffn.linear1.weight", "ffn.linear2.weight"):
        for w in weights(m, suffix):
            assert w.std().item() == pytest.approx(0.02, rel=0.05)
    assert m.embed.weight[PAD_ID + 1 :].std().item() == pytest.approx(0.02, rel=0.05)
