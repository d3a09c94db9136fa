"""Our weights in MarianMTModel's layout, on random weights (no training): the permutation,
the logits, the refusal of pre-LN, and the search rules as a logits processor."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from transformers import MarianConfig, MarianMTModel

from model.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from model.embedding import sinusoidal_positions
from model.transformer import Transformer
from serve.hf_layout import (
    LayoutError,
    marian_config,
    marian_state_dict,
    sin_first_permutation,
)
from serve.hf_rules import SearchRules
from tests.serve.conftest import marian_logits


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_model(**overrides: object) -> Transformer:
    """A 2+2-layer model whose every parameter (biases and LayerNorms included) is random."""
    base: dict[str, object] = dict(
        vocab_size=40, d_model=16, n_heads=4, d_ff=32, encoder_layers=2, decoder_layers=2,
        dropout=0.0, max_positions=64,
    )  # fmt: skip
    base.update(overrides)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**base)).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def as_marian(model: Transformer) -> MarianMTModel:
    marian = MarianMTModel(MarianConfig(**marian_config(model.cfg))).eval()
    missing, unexpected = marian.load_state_dict(
        marian_state_dict(model.state_dict(), model.cfg), strict=False
    )
    assert not unexpected and all("embed_positions" in k for k in missing)
    return marian


def test_marian_position_table_is_ours_permuted() -> None:
    model = as_marian(random_model(d_model=32, n_heads=4))
    ours = sinusoidal_positions(64, 32)
    perm = sin_first_permutation(32)
    assert perm.tolist()[:4] == [0, 2, 4, 6] and perm.tolist()[16:18] == [1, 3]
    for table in (model.model.encoder.embed_positions, model.model.decoder.embed_positions):
        assert torch.equal(table.weight, ours[:, perm])


def test_logits_equal_on_padded_batch() -> None:
    ours = random_model()
    marian = as_marian(ours)
    src = torch.tensor([[5, 6, 7, 8, 9, EOS_ID], [10, 11, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[BOS_ID, 12, 13, 14], [BOS_ID, 15, PAD_ID, PAD_ID]])
    with torch.no_grad():
        expected = ours(src, tgt)  # (B, T, V)
    assert (expected - marian_logits(marian, src, tgt)).abs().max().item() < 1e-5


def test_tied_embeddings_and_zero_bias() -> None:
    marian = as_marian(random_model())
    shared = marian.model.shared.weight
    assert marian.lm_head.weight.data_ptr() == shared.data_ptr()
    assert marian.model.decoder.embed_tokens.weight.data_ptr() == shared.data_ptr()
    assert not marian.final_logits_bias.any()


def test_pre_norm_has_no_marian_layout() -> None:
    model = random_model(pre_norm=True)
    with pytest.raises(LayoutError, match="pre_norm"):
        marian_state_dict(model.state_dict(), model.cfg)


def test_search_rules_keep_eos_log_prob_at_each_rows_limit() -> None:
    rules = SearchRules(torch.tensor([2, 5]), beams=2)  # rows 0-1 limit 2, rows 2-3 limit 5
    scores = torch.log_softmax(torch.randn(4, 10), dim=-1)
    out = rules(torch.full((4, 2), BOS_ID), scores)  # choosing token 2
    assert out[:, PAD_ID].eq(-math.inf).all() and out[:, BOS_ID].eq(-math.inf).all()
    assert torch.equal(out[:2, EOS_ID], scores[:2, EOS_ID])
    assert out[:2].isfinite().sum().item() == 2  # only EOS left at the limit
    assert torch.equal(out[2:, 4:], scores[2:, 4:])  # the other rows untouched
