"""Our weights in the layout of Transformers' MarianMTModel: names, one permutation, config.

Marian in Transformers is the same architecture as ours: post-LN encoder and decoder layers
(x = LayerNorm(x + Sublayer(x))), ReLU feed-forward blocks (`activation_function="relu"`),
token embeddings scaled by sqrt(d_model) (`scale_embedding=True`), fixed sinusoidal positions
counted from 0 for the first token of each side, one embedding matrix shared by encoder,
decoder and output projection (`share_encoder_decoder_embeddings`, `tie_word_embeddings`),
attention projections with biases, no final LayerNorm on either stack, and an output bias
(`final_logits_bias`) that we leave at zero. The names differ (table `_LAYER_NAMES`), and
one layout differs:

The position table. Ours interleaves each frequency's pair, PE[:, 2i] = sin(w_i p) and
PE[:, 2i+1] = cos(w_i p); Marian puts every sine first, PE_M[:, i] = sin(w_i p) and
PE_M[:, D/2 + i] = cos(w_i p), and computes the table itself (it is not part of the weights).
So PE_M = PE[:, perm] with perm = [0, 2, 4, ..., D-2, 1, 3, ..., D-1].

We make the two models equal exactly by running Marian on the permuted residual stream: every
residual-stream vector x of our model becomes x[perm] in the exported one. That stream is
what embeddings, positions, LayerNorms, attention and feed-forward outputs and their inputs
live in, so each weight is permuted on the side that touches it:

- embedding matrix E (V, D): columns, E[:, perm]; the tied output projection h E^T is then
  unchanged, since sum_j h[perm_j] E[:, perm_j] = sum_j h_j E[:, j];
- Linear layers reading the stream (q/k/v projections, the first feed-forward layer, and the
  cross-attention k/v reading the encoder output): input features, W[:, perm];
- Linear layers writing to the stream (attention output projection, second feed-forward
  layer): output features and bias, W[perm, :] and b[perm];
- LayerNorm weight and bias: [perm] (mean and variance over the features are invariant to
  the order).

The outputs of the q/k/v projections are not stream coordinates: they are split into heads
(D -> H x Dk) inside attention, and their order is left alone, so each head sees the same
queries, keys and values as in our model. The result differs from ours only by the order of
floating-point summation (about 1e-6).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from model.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig

# Our module name -> Marian's, per layer kind.
_LAYER_NAMES: dict[str, dict[str, str]] = {
    "encoder": {
        "self_attn": "self_attn",
        "norm1": "self_attn_layer_norm",
        "ffn.linear1": "fc1",
        "ffn.linear2": "fc2",
        "norm2": "final_layer_norm",
    },
    "decoder": {
        "self_attn": "self_attn",
        "norm1": "self_attn_layer_norm",
        "cross_attn": "encoder_attn",
        "norm2": "encoder_attn_layer_norm",
        "ffn.linear1": "fc1",
        "ffn.linear2": "fc2",
        "norm3": "final_layer_norm",
    },
}
_READS_STREAM = ("q_proj", "k_proj", "v_proj", "linear1")  # W[:, perm], bias unchanged
_WRITES_STREAM = ("out_proj", "linear2")  # W[perm, :], b[perm]


class LayoutError(ValueError):
    """A model that has no exact Marian equivalent; `str()` is one line."""


def sin_first_permutation(d_model: int) -> Tensor:
    """perm (D,) int64 with PE_marian[:, j] = PE_ours[:, perm[j]]: even dims, then odd dims."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def check_exportable(cfg: ModelConfig) -> None:
    """Refuse what Marian cannot express (pre-LN stacks end with a LayerNorm Marian lacks)."""
    if cfg.pre_norm:
        raise LayoutError("model.pre_norm=true has no MarianMTModel equivalent (Marian is post-LN)")


def _permute(name: str, tensor: Tensor, perm: Tensor) -> Tensor:
    """Apply the residual-stream permutation to one of our parameters, by its role."""
    leaf, kind = name.rsplit(".", 2)[-2:]  # e.g. ("q_proj", "weight")
    if name.startswith("embed."):
        return tensor[:, perm]  # (V, D)
    if leaf.startswith("norm"):
        return tensor[perm]  # (D,)
    if leaf in _READS_STREAM:
        return tensor[:, perm] if kind == "weight" else tensor  # (out, D) / (out,)
    if leaf in _WRITES_STREAM:
        return tensor[perm]  # weight (D, in) / bias (D,)
    raise LayoutError(f"no layout rule for parameter {name}")


def _marian_name(name: str) -> str:
    """`encoder.layers.0.ffn.linear1.weight` -> `model.encoder.layers.0.fc1.weight`."""
    stack, _, index, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    if module.endswith(("q_proj", "k_proj", "v_proj", "out_proj")):
        attn, proj = module.rsplit(".", 1)
        return f"model.{stack}.layers.{index}.{_LAYER_NAMES[stack][attn]}.{proj}.{kind}"
    return f"model.{stack}.layers.{index}.{_LAYER_NAMES[stack][module]}.{kind}"


def marian_state_dict(state: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Our consolidated state dict -> MarianMTModel's (every key it loads, fp32, contiguous).

    The position tables are not included: Marian computes them (and does not save them).
    """
    check_exportable(cfg)
    perm = sin_first_permutation(cfg.d_model)
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        value = _permute(name, tensor.float(), perm).contiguous()
        if name == "embed.weight":
            for key in (
                "model.shared.weight",
                "model.encoder.embed_tokens.weight",
                "model.decoder.embed_tokens.weight",
                "lm_head.weight",
            ):
                out[key] = value
        else:
            out[_marian_name(name)] = value
    out["final_logits_bias"] = torch.zeros(1, cfg.vocab_size or 0)  # (1, V)
    return out


def marian_config(cfg: ModelConfig) -> dict[str, Any]:
    """MarianConfig keyword arguments for our ModelConfig (special ids: pad 0, BOS 2, EOS 3)."""
    check_exportable(cfg)
    return {
        "vocab_size": cfg.vocab_size,
        "decoder_vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "activation_function": "relu",
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "max_position_embeddings": cfg.max_positions,
        "scale_embedding": True,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        # Our decoder starts from BOS (Marian's own checkpoints start from the zero pad row).
        "decoder_start_token_id": BOS_ID,
        "forced_eos_token_id": EOS_ID,
        "dtype": "float32",
    }


def generation_defaults(cfg: ModelConfig) -> dict[str, Any]:
    """GenerationConfig defaults of the export: `paperscale translate`'s beam 4, EOS forced at
    the length limit, PAD and BOS never generated (as in model/search.py).

    `length_penalty` is Transformers' own (score / length^alpha), not our GNMT penalty; see
    serve/__init__.py for what matches exactly.
    """
    return {
        "decoder_start_token_id": BOS_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "forced_eos_token_id": EOS_ID,
        "suppress_tokens": [PAD_ID, BOS_ID],
        "num_beams": 4,
        "early_stopping": True,
        "length_penalty": 0.6,
        "max_length": cfg.max_positions,
    }
