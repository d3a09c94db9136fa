"""Shared builders for the model tests: tiny configs, seeded models and padded batches."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from model.config import EOS_ID, PAD_ID, ModelConfig
from model.transformer import Transformer


def tiny_config(**overrides: object) -> ModelConfig:
    """A 2+2-layer, d_model 16 model with dropout off, small enough for exact checks."""
    base: dict[str, object] = dict(
        vocab_size=40,
        d_model=16,
        n_heads=4,
        d_ff=32,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    base.update(overrides)
    return ModelConfig(**base)  # type: ignore[arg-type]


def build(seed: int = 0, **overrides: object) -> Transformer:
    """A tiny model in eval mode with deterministic random weights."""
    torch.manual_seed(seed)
    return Transformer(tiny_config(**overrides)).eval()


def padded_batch(lengths: list[int], vocab: int, seed: int = 0) -> torch.Tensor:
    """(B, max(lengths)) sources: random tokens >= 4, EOS last, PAD_ID after."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD_ID, dtype=torch.long)
    for i, n in enumerate(lengths):
        out[i, : n - 1] = torch.randint(4, vocab, (n - 1,), generator=g)
        out[i, n - 1] = EOS_ID
    return out


@pytest.fixture(autouse=True)
def _single_thread_fp32() -> Iterator[None]:
    """Seeded, float32 and one intra-op thread: these tensors are tiny, and extra threads
    only spin (and slow down by 10x or more) when the machine is busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)
