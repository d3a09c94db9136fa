"""Helpers shared by the serving tests."""

from __future__ import annotations

import torch
from transformers import MarianMTModel

from model.config import PAD_ID


@torch.no_grad()
def marian_logits(model: MarianMTModel, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """Transformers' logits (B, T, V) for our padded ids (B, S) and decoder inputs (B, T)."""
    return model(
        input_ids=src,
        attention_mask=src.ne(PAD_ID),
        decoder_input_ids=tgt,
        decoder_attention_mask=tgt.ne(PAD_ID),
    ).logits
