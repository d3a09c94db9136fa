"""Activation memory of one micro-batch, as the planner counts it: what autograd keeps for
backward per token, and the fixed work space of the training loss.

Pure arithmetic on the model's shapes (no torch), checked against what autograd actually saves
(tests/launch/test_plan.py) and against the loss's measured peak (bench/loss_memory.py).
"""

from __future__ import annotations

from launch.cost_model.save import weight_bytes
from model.config import LossChunking, ModelConfig


def activation_bytes_per_token(
    cfg: ModelConfig, precision: str = "bf16", compiled: bool = False
) -> dict[str, float]:
    """Bytes kept for backward per token of a micro-batch (per side), by term.

    Counted from what autograd saves in model/ (post-LN layers, SDPA attention whose fused
    kernels keep the output and a float32 log-sum-exp per head instead of the score matrix),
    with a = bytes of an activation (2 for bf16/fp16, 4 for fp32), d = d_model, f = d_ff,
    h = heads, V = vocabulary:
      encoder layer, per source token: input, q, k, v, attention output, its merged-heads copy,
        LayerNorm input (7 d a), FFN input, ReLU output, LayerNorm input ((2 d + f) a), two
        dropout masks (2 d bytes), log-sum-exp (4 h) and two LayerNorm mean/rstd (16);
      decoder layer, per target token: self-attention as above (7 d a), cross-attention query
        input, q, output, merged copy, LayerNorm input (5 d a), FFN ((2 d + f) a), three masks
        (3 d), 8 h + 24; per source token: the cross-attention k and v (2 d a);
      embeddings: the scaled embedding and its dropout mask (d a + d) per token each side;
      loss, per target token: model/loss.py's chunked loss computes the gradient of the decoder
        states in its forward and keeps it for backward (d a) - the (B, T, V) logits never
        exist whole; compiled (`train.compile`, where the compiler fuses the plain loss
        instead), the logits in the compute dtype kept for backward and their gradient in
        backward (2 a V).
    Attention dropout > 0 would make SDPA fall back to the math kernel that saves (h, S, S)
    scores; it is off in every preset and not counted.
    """
    a = weight_bytes(precision)
    d, f, h = cfg.d_model, cfg.d_ff, cfg.n_heads
    assert cfg.vocab_size is not None
    enc_layer = (9 * d + f) * a + 2 * d + 4 * h + 16
    dec_layer_tgt = (14 * d + f) * a + 3 * d + 8 * h + 24
    dec_layer_src = 2 * d * a
    embed = d * a + d
    loss = 2 * a * cfg.vocab_size if compiled else d * a
    return {
        "encoder": enc_layer * cfg.encoder_layers,
        "decoder": dec_layer_tgt * cfg.decoder_layers,
        "cross_kv": dec_layer_src * cfg.decoder_layers,
        "embeddings": 2 * embed,
        "loss": loss,
        "encoder_layer": enc_layer,
        "decoder_layer": dec_layer_tgt + dec_layer_src,
    }


def loss_workspace_bytes(
    cfg: ModelConfig,
    precision: str = "bf16",
    compiled: bool = False,
    chunking: LossChunking | None = None,
    tokens: int | None = None,
) -> float:
    """Peak bytes of the chunked loss's forward beyond its per-token terms.

    The (V, d) gradient of the projection is accumulated in fp32 (4 V d) over the chunks of C
    logits (`chunking`, model.config.loss_chunking: a CPU's by default). On top of it, the
    larger of two moments of a chunk: in fp32 its logits and their log-probabilities (8 C), in
    bf16 / fp16 its logits and their softmax in the compute dtype (2 a C); or its gradient in
    the compute dtype with one slice of S rows of the (V, d) product (the chunking's slice, or
    all V) and that slice's fp32 copy (a C + (a + 4) S d). C is the chunking's, or the
    micro-batch's `tokens` x V logits when fewer (a GPU's one chunk); without `tokens`, the
    bound for any batch. None when compiled: the fused plain loss has no chunks (its logits
    are per token, above).
    """
    if compiled:
        return 0.0
    chunking = chunking or LossChunking()
    a = weight_bytes(precision)
    assert cfg.vocab_size is not None
    vd = cfg.vocab_size * cfg.d_model
    c = chunking.elements
    if tokens is not None:
        c = min(c, tokens * cfg.vocab_size)
    first = 8 * c if a == 4 else 2 * a * c
    rows = min(chunking.w_slice_rows or cfg.vocab_size, cfg.vocab_size)
    sliced = (a + 4) * rows * cfg.d_model
    return float(4 * vd + max(first, a * c + sliced))


def projection_copy_bytes(
    cfg: ModelConfig, precision: str = "bf16", checkpointing: bool = False
) -> float:
    """The concatenated projection weights each attention sublayer keeps for backward
    (model/attention.py: Q, K, V of self-attention as one (3d, d) product, cross-attention's
    K, V as one (2d, d)): 3 d^2 a per encoder layer, 5 d^2 a per decoder layer, whatever the
    batch; with activation checkpointing only the recomputed layer's."""
    a = weight_bytes(precision)
    per_layer = (3 * cfg.encoder_layers, 5 * cfg.decoder_layers)
    units = max(3, 5 if cfg.decoder_layers else 0) if checkpointing else sum(per_layer)
    return float(units * cfg.d_model * cfg.d_model * a)


def per_token_bytes(
    cfg: ModelConfig, precision: str = "bf16", checkpointing: bool = False, compiled: bool = False
) -> float:
    """Activation bytes per token of a micro-batch (per side, source and target alike).

    With activation checkpointing each layer keeps only its input (d a per token) and one
    layer at a time is recomputed in backward, so the layer terms become L d a + one layer's
    terms; the embeddings and the loss are outside the checkpointed layers.
    """
    t = activation_bytes_per_token(cfg, precision, compiled)
    if checkpointing:
        layer_inputs = cfg.d_model * weight_bytes(precision)
        layer_inputs *= cfg.encoder_layers + cfg.decoder_layers
        layers = layer_inputs + max(t["encoder_layer"], t["decoder_layer"])
    else:
        layers = t["encoder"] + t["decoder"] + t["cross_kv"]
    return float(layers + t["embeddings"] + t["loss"])


def activation_bytes(
    cfg: ModelConfig,
    tokens: int,
    precision: str = "bf16",
    checkpointing: bool = False,
    compiled: bool = False,
    chunking: LossChunking | None = None,
) -> float:
    """Activation memory of one micro-batch of `tokens` padded tokens per side: the per-token
    terms and, for a non-empty batch, the loss's work space under `chunking` (a CPU's when
    None)."""
    if tokens <= 0:
        return 0.0
    per_token = per_token_bytes(cfg, precision, checkpointing, compiled)
    work = loss_workspace_bytes(cfg, precision, compiled, chunking, tokens)
    return float(tokens) * per_token + work + projection_copy_bytes(cfg, precision, checkpointing)
