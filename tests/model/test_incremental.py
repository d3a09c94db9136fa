"""Decoding with the key/value cache gives the logits of full recomputation at every step."""

from __future__ import annotations

import pytest
import torch

from model.cache import DecoderCache
from model.config import BOS_ID, PAD_ID

from .conftest import build, padded_batch


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-ln", "pre-ln"])
def test_cache_matches_recomputation_each_step(pre_norm: bool) -> None:
    model = build(seed=5, pre_norm=pre_norm)
    src = padded_batch([9, 4, 6, 2], vocab=40, seed=1)  # padded sources
    tgt = padded_batch([8, 8, 8, 8], vocab=40, seed=2)
    tgt[:, 0] = BOS_ID
    tgt[2, 5:] = PAD_ID  # a finished row fed padding, as beam search does
    with torch.no_grad():
        enc = model.encode(src)
        cache = DecoderCache()
        for t in range(tgt.shape[1]):
            step = model.decode(tgt[:, t : t + 1], enc, cache)  # (B, 1, V)
            full = model.decode(tgt[:, : t + 1], enc)  # (B, t+1, V)
            assert cache.length == t + 1
            assert (step[:, 0] - full[:, -1]).abs().max().item() < 1e-5, f"step {t}"


def test_cache_prefill_then_steps_and_reorder() -> None:
    model = build(seed=6)
    src = padded_batch([6, 3, 5], vocab=40, seed=7)
    tgt = padded_batch([7, 7, 7], vocab=40, seed=8)
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        enc = model.encode(src)
        cache = DecoderCache()
        model.decode(tgt[:, :3], enc, cache)  # several positions at once
        index = torch.tensor([2, 0, 0])
        cache.reorder(index)
        enc2 = enc.select(index)
        tgt2 = tgt.index_select(0, index)
        for t in range(3, 7):
            step = model.decode(tgt2[:, t : t + 1], enc2, cache)
            full = model.decode(tgt2[:, : t + 1], enc2)
            assert (step[:, 0] - full[:, -1]).abs().max().item() < 1e-5


def test_positions_beyond_table_extend() -> None:
    model = build(seed=9, max_positions=4)
    src = padded_batch([6, 3], vocab=40)
    tgt = padded_batch([7, 7], vocab=40, seed=1)
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        enc = model.encode(src)
        cache = DecoderCache()
        steps = [model.decode(tgt[:, t : t + 1], enc, cache) for t in range(7)]
        full = model.decode(tgt, enc)
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < 1e-5
