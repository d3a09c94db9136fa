"""Reduced-precision models (as DeepSpeed runs them) train and decode without dtype errors."""

from __future__ import annotations

import torch

from model.config import BOS_ID, PAD_ID
from model.loss import label_smoothed_loss
from model.search import beam_search, greedy_search

from .conftest import build, padded_batch


def test_bfloat16_forward_loss_backward_and_search() -> None:
    model = build(seed=4, dropout=0.1).to(torch.bfloat16).train()
    src = padded_batch([6, 3, 5], vocab=40, seed=1)
    tgt = padded_batch([5, 5, 3], vocab=40, seed=2)
    tgt_in = torch.cat([torch.full((3, 1), BOS_ID), tgt[:, :-1]], dim=1)
    tgt_in[2, 3:] = PAD_ID
    logits = model(src, tgt_in)
    assert logits.dtype == torch.bfloat16 and logits.shape == (3, 5, 40)
    loss, nll, n = label_smoothed_loss(logits, tgt, 0.1)
    assert loss.dtype == nll.dtype == torch.float32 and torch.isfinite(loss) and n.item() == 13
    loss.backward()
    assert model.embed.weight.grad is not None
    model.eval()
    with torch.inference_mode():
        greedy = greedy_search(model, src, max_len_b=4)
        beam = beam_search(model, src, beam=2, max_len_b=4)
    assert len(greedy) == len(beam) == 3
    assert all(len(y) <= n + 3 for y, n in zip(greedy, [6, 3, 5], strict=True))
