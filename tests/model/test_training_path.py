"""The training forward is ready for a GPU: no host sync (it compiles as one graph), decoder
self-attention by SDPA's is_causal with no mask, and no mask at all for an unpadded batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import model.attention as attention_module
from model.config import BOS_ID, EOS_ID, PAD_ID
from model.loss import label_smoothed_loss

from .conftest import build, padded_batch


def batch(padded: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (B, S), tgt_in (B, T), tgt_out (B, T), right-padded when `padded`."""
    src = padded_batch([7, 4, 6] if padded else [6, 6, 6], vocab=40, seed=1)
    body = padded_batch([5, 3, 5] if padded else [5, 5, 5], vocab=40, seed=2)  # ends with EOS
    tgt_in = torch.cat([torch.full((3, 1), BOS_ID), body[:, :-1]], dim=1)  # (B, T)
    tgt_in = tgt_in.masked_fill(tgt_in.eq(EOS_ID), PAD_ID)
    return src, tgt_in, body


class Recorder:
    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[dict[str, Any]] = []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> Any:
        self.calls.append({"tq": q.shape[-2], "tk": k.shape[-2], **kw})
        return self.real(q, k, v, **kw)


@pytest.fixture
def sdpa(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder(torch.nn.functional.scaled_dot_product_attention)
    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", recorder)
    return recorder


def test_decoder_self_attention_is_causal_without_a_mask(sdpa: Recorder) -> None:
    model = build(seed=3).train()
    src, tgt_in, tgt_out = batch(padded=True)
    model(src, tgt_in, tgt_out, 0.1, src_padded=True)
    layers = model.cfg.encoder_layers + 2 * model.cfg.decoder_layers
    assert len(sdpa.calls) == layers
    encoder, decoder = sdpa.calls[: model.cfg.encoder_layers], sdpa.calls[2:]
    self_calls, cross_calls = decoder[0::2], decoder[1::2]
    assert all(c["is_causal"] and c["attn_mask"] is None for c in self_calls)
    assert all(c["attn_mask"] is not None and not c["is_causal"] for c in encoder + cross_calls)


def test_an_unpadded_batch_passes_no_mask_anywhere(sdpa: Recorder) -> None:
    model = build(seed=3).train()
    src, tgt_in, tgt_out = batch(padded=False)
    assert not src.eq(PAD_ID).any()
    model(src, tgt_in, tgt_out, 0.1, src_padded=False)
    assert sdpa.calls and all(c["attn_mask"] is None for c in sdpa.calls)


@pytest.mark.parametrize("padded", [True, False])
def test_training_loss_equals_the_masked_logits_path(padded: bool) -> None:
    """The is_causal path scores every real position exactly like the explicit masks do."""
    model = build(seed=4)
    src, tgt_in, tgt_out = batch(padded)
    with torch.no_grad():
        logits = model.decode(tgt_in, model.encode(src))  # masks from the ids themselves
        ref = label_smoothed_loss(logits, tgt_out, 0.1)
        ours = model(src, tgt_in, tgt_out, 0.1, src_padded=padded)
    for a, b in zip(ref, ours, strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(600)
def test_training_forward_and_loss_compile_as_one_graph() -> None:
    """fullgraph=True fails on any graph break, e.g. a data-dependent host sync."""
    model = build(seed=5).train()
    src, tgt_in, tgt_out = batch(padded=True)

    def step(src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        loss, _, _ = model(src, tgt_in, tgt_out, 0.1, src_padded=True)
        return loss

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.manual_seed(0)
    eager_loss = step(src, tgt_in, tgt_out)
    torch.manual_seed(0)
    compiled_loss = compiled(src, tgt_in, tgt_out)
    compiled_loss.backward()
    assert torch.allclose(eager_loss, compiled_loss, rtol=1e-5)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def shaped_batch(
    rows: int, src_len: int, tgt_len: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A right-padded (rows, src_len) / (rows, tgt_len) batch: the longest pair fills it."""
    src = padded_batch([src_len] + [max(2, src_len - 2)] * (rows - 1), vocab=40, seed=seed)
    body = padded_batch([tgt_len] + [max(2, tgt_len - 1)] * (rows - 1), vocab=40, seed=seed + 1)
    tgt_in = torch.cat([torch.full((rows, 1), BOS_ID), body[:, :-1]], dim=1)  # (B, T)
    tgt_in = tgt_in.masked_fill(tgt_in.eq(EOS_ID), PAD_ID)
    return src, tgt_in, body


@pytest.mark.timeout(600)
def test_compiled_training_step_is_one_graph_for_every_batch_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trainer compiles with dynamic shapes and without duck sizing (trainer/ds/engine.py):
    batches of other sizes and lengths -- and so other row counts B*T, which the chunked loss
    loops over -- reuse the first graph, also when the first batch's source and target lengths
    are equal. A recompilation raises here."""
    import torch._dynamo
    import torch.fx.experimental._config as fx_config

    from trainer.ds.engine import compile_for_varying_shapes

    monkeypatch.setattr(fx_config, "use_duck_shape", fx_config.use_duck_shape)  # restored after
    kwargs = compile_for_varying_shapes()
    model = build(seed=5).train()

    def step(src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        loss, _, _ = model(src, tgt_in, tgt_out, 0.1, src_padded=True)
        return loss

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager", **kwargs)
    shapes = [(3, 7, 7), (5, 9, 4), (2, 4, 11), (8, 6, 6)]  # (B, S, T); S == T first
    for i, shape in enumerate(shapes):
        src, tgt_in, tgt_out = shaped_batch(*shape, seed=10 + i)
        compiled_loss = compiled(src, tgt_in, tgt_out)
        torch.manual_seed(0)
        assert torch.allclose(compiled_loss, step(src, tgt_in, tgt_out), rtol=1e-5)
        compiled_loss.backward()
        if i == 0:  # from now on a recompilation is an error
            monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    torch._dynamo.reset()
