"""Our layers compute exactly what torch.nn.Transformer computes with the same weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from model.attention import MultiHeadAttention
from model.config import BOS_ID, PAD_ID
from model.transformer import Transformer

from .conftest import build, padded_batch


def copy_attention(src: MultiHeadAttention, dst: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        dst.in_proj_weight.copy_(
            torch.cat([src.q_proj.weight, src.k_proj.weight, src.v_proj.weight], dim=0)
        )
        dst.in_proj_bias.copy_(torch.cat([src.q_proj.bias, src.k_proj.bias, src.v_proj.bias]))
        dst.out_proj.weight.copy_(src.out_proj.weight)
        dst.out_proj.bias.copy_(src.out_proj.bias)


def reference_from(model: Transformer) -> nn.Transformer:
    """An nn.Transformer holding `model`'s weights (final norms: ours, or Identity)."""
    cfg = model.cfg
    ref = nn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.n_heads,
        num_encoder_layers=cfg.encoder_layers,
        num_decoder_layers=cfg.decoder_layers,
        dim_feedforward=cfg.d_ff,
        dropout=0.0,
        batch_first=True,
        norm_first=cfg.pre_norm,
    )
    for ours, theirs in zip(model.encoder.layers, ref.encoder.layers, strict=True):
        copy_attention(ours.self_attn, theirs.self_attn)
        for name in ("linear1", "linear2"):
            getattr(theirs, name).load_state_dict(getattr(ours.ffn, name).state_dict())
        for name in ("norm1", "norm2"):
            getattr(theirs, name).load_state_dict(getattr(ours, name).state_dict())
    for ours, theirs in zip(model.decoder.layers, ref.decoder.layers, strict=True):
        copy_attention(ours.self_attn, theirs.self_attn)
        copy_attention(ours.cross_attn, theirs.multihead_attn)
        for name in ("linear1", "linear2"):
            getattr(theirs, name).load_state_dict(getattr(ours.ffn, name).state_dict())
        for name in ("norm1", "norm2", "norm3"):
            getattr(theirs, name).load_state_dict(getattr(ours, name).state_dict())
    if cfg.pre_norm:
        ref.encoder.norm.load_state_dict(model.encoder.norm.state_dict())
        ref.decoder.norm.load_state_dict(model.decoder.norm.state_dict())
    else:
        ref.encoder.norm = nn.Identity()
        ref.decoder.norm = nn.Identity()
    # train() keeps nn.TransformerEncoder off its nested-tensor fast path (which zeroes padded
    # outputs); with dropout 0 it is deterministic.
    return ref.train()


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-ln", "pre-ln"])
def test_matches_torch_transformer(pre_norm: bool) -> None:
    model = build(seed=1, d_model=32, n_heads=4, d_ff=64, encoder_layers=3, decoder_layers=2)
    if pre_norm:
        model = build(seed=1, d_model=32, n_heads=4, d_ff=64, pre_norm=True)
        with torch.no_grad():  # non-trivial final norms
            for norm in (model.encoder.norm, model.decoder.norm):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
    ref = reference_from(model)
    src = padded_batch([7, 4, 6], vocab=40, seed=3)  # (B, S) with padding
    tgt = padded_batch([5, 3, 5], vocab=40, seed=4)
    tgt[:, 0] = BOS_ID
    tgt[1, 2:] = PAD_ID

    with torch.no_grad():
        ours = model.decode_hidden(tgt, model.encode(src))  # (B, T, D)
        src_pad, tgt_pad = src.eq(PAD_ID), tgt.eq(PAD_ID)
        t = tgt.shape[1]
        theirs = ref(
            model.embed(src),
            model.embed(tgt),
            tgt_mask=torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1),
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
        enc_ours = model.encode(src).out
        enc_theirs = ref.encoder(model.embed(src), src_key_padding_mask=src_pad)
    assert not torch.isnan(ours).any()
    assert (enc_ours - enc_theirs).abs().max().item() < 1e-5
    assert (ours - theirs).abs().max().item() < 1e-5


def test_logits_use_transposed_embedding() -> None:
    model = build(seed=2)
    src = padded_batch([5, 3], vocab=40)
    tgt = torch.tensor([[BOS_ID, 7, 8], [BOS_ID, 9, PAD_ID]])
    with torch.no_grad():
        h = model.decode_hidden(tgt, model.encode(src))
        logits = model(src, tgt)
    assert torch.allclose(logits, h @ model.embed.weight.T, atol=1e-6)


def test_fully_padded_rows_are_finite() -> None:
    model = build(seed=3)
    model.train()  # gradients must be finite too
    src = padded_batch([5, 3], vocab=40)
    src[1] = PAD_ID  # a sentence that is all padding
    tgt = torch.tensor([[BOS_ID, 7, 8], [PAD_ID, PAD_ID, PAD_ID]])
    logits = model(src, tgt)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
