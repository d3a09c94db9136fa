"""Closed-form parameter count of the Transformer, from the config's shapes alone."""

from __future__ import annotations

from model.config import ModelConfig


def count_parameters(cfg: ModelConfig) -> dict[str, int]:
    """{'total', 'embeddings', 'encoder', 'decoder'} for the model `Transformer(cfg)` builds.

    The embedding matrix is shared by source, target and output, so it is counted once.
    Each attention sublayer has four d x d projections with biases; each FFN d x d_ff and
    d_ff x d with biases; each LayerNorm a gain and a bias (pre-LN stacks add a final one).
    """
    if cfg.vocab_size is None:
        raise ValueError("cfg.vocab_size must be set")
    d, f = cfg.d_model, cfg.d_ff
    attention = 4 * (d * d + d)
    ffn = d * f + f + f * d + d
    norm = 2 * d
    final = norm if cfg.pre_norm else 0
    encoder = cfg.encoder_layers * (attention + ffn + 2 * norm) + final
    decoder = cfg.decoder_layers * (2 * attention + ffn + 3 * norm) + final
    embeddings = cfg.vocab_size * d
    return {
        "total": embeddings + encoder + decoder,
        "embeddings": embeddings,
        "encoder": encoder,
        "decoder": decoder,
    }
