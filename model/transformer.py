"""The encoder-decoder Transformer of "Attention Is All You Need"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend
from torch.utils.checkpoint import checkpoint

from model.attention import MultiHeadAttention, build_attn_mask
from model.cache import DecoderCache
from model.config import PAD_ID, LossChunking, ModelConfig, loss_chunking
from model.embedding import TransformerEmbedding
from model.layers import DecoderLayer, EncoderLayer, FeedForward
from model.loss import chunked_label_smoothed_loss


class EncoderOut(NamedTuple):
    """What the decoder needs from the encoder."""

    out: Tensor  # (B, S, D) top encoder layer
    src_pad_mask: Tensor | None  # (B, S) bool, True = pad; None: no row is padded

    def select(self, index: Tensor) -> EncoderOut:
        """Rows `index` of the batch, e.g. each sentence repeated once per beam."""
        mask = self.src_pad_mask
        return EncoderOut(
            self.out.index_select(0, index), None if mask is None else mask.index_select(0, index)
        )


def _final_norm(cfg: ModelConfig) -> nn.Module:
    """Pre-LN stacks end with a LayerNorm (their residual stream is unnormalised)."""
    return nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()


class Encoder(nn.Module):
    """A stack of encoder layers over already-embedded source positions."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.norm = _final_norm(cfg)
        self.checkpoint_layers = False  # recompute each layer in backward (set_activation_...)

    def forward(self, x: Tensor, src_pad_mask: Tensor | None) -> Tensor:
        """x (B, S, D), src_pad_mask (B, S) True = pad -> (B, S, D)."""
        s = x.shape[1]
        mask = build_attn_mask(src_pad_mask, s, s, causal=False)  # (B, 1, 1, S) or None
        for layer in self.layers:
            if self.checkpoint_layers and self.training:
                x = checkpoint(layer, x, mask, use_reentrant=False)
            else:
                x = layer(x, mask)
        return self.norm(x)


class Decoder(nn.Module):
    """A stack of decoder layers over already-embedded target positions."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.norm = _final_norm(cfg)
        self.checkpoint_layers = False

    def forward(
        self,
        y: Tensor,
        memory: Tensor,
        src_pad_mask: Tensor | None,
        tgt_pad_mask: Tensor | None,
        cache: DecoderCache | None = None,
        right_padded: bool = False,
    ) -> Tensor:
        """y (B, T, D) new target positions, memory (B, S, D) -> hidden states (B, T, D).

        src_pad_mask (B, S) and tgt_pad_mask (B, T) are True at padding. With a cache, the
        cached target positions (and their padding) come before `y`. `right_padded` (training:
        every row's padding comes after its tokens, and padded positions are not scored):
        self-attention is SDPA's is_causal with no mask, exact for every real position, since
        a real position's earlier keys are all real.
        """
        if right_padded and cache is None:
            s = memory.shape[1]
            cross_mask = build_attn_mask(src_pad_mask, 0, s, causal=False)  # (B, 1, 1, S) | None
            return self._run(y, memory, None, cross_mask, None, True)
        t = y.shape[1]
        offset = 0
        key_pad = tgt_pad_mask
        if cache is not None:
            offset = cache.length
            cache.ensure_layers(len(self.layers))
            if tgt_pad_mask is None:
                tgt_pad_mask = torch.zeros(y.shape[:2], dtype=torch.bool, device=y.device)
            if cache.tgt_pad_mask is not None:
                key_pad = torch.cat([cache.tgt_pad_mask, tgt_pad_mask], dim=1)  # (B, L + T)
            else:
                key_pad = tgt_pad_mask  # (B, T)
            cache.tgt_pad_mask = key_pad
            if not bool(key_pad.any()):
                key_pad = None
        self_mask = build_attn_mask(
            key_pad, t, offset + t, causal=True, offset=offset, device=y.device
        )  # (B, 1, T, L + T) or None
        s = memory.shape[1]
        cross_mask = build_attn_mask(src_pad_mask, t, s, causal=False)  # (B, 1, 1, S) or None
        return self._run(y, memory, self_mask, cross_mask, cache, False)

    def _run(
        self,
        y: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        cache: DecoderCache | None,
        causal: bool,
    ) -> Tensor:
        """The layers over y (B, T, D) with the masks built by `forward`; then the norm."""
        for i, layer in enumerate(self.layers):
            self_cache = cache.self_kv[i] if cache is not None else None
            cross_cache = cache.cross_kv[i] if cache is not None else None
            if self.checkpoint_layers and self.training and cache is None:
                y = checkpoint(
                    layer, y, memory, self_mask, cross_mask, None, None, causal,
                    use_reentrant=False,
                )  # fmt: skip
            elif cache is not None:  # decoding: eager, whether or not the layer is compiled
                y = layer._call_impl(y, memory, self_mask, cross_mask, self_cache, cross_cache,
                                     causal)  # fmt: skip
            else:
                y = layer(y, memory, self_mask, cross_mask, None, None, causal)
        return self.norm(y)


class Transformer(nn.Module):
    """Encoder-decoder Transformer with one embedding matrix shared three ways.

    The same vocab x d_model matrix E embeds source and target tokens and, transposed, maps
    decoder states to logits (logits = h E^T, no bias), as in section 3.4 of the paper.
    Padding (PAD_ID) in `src` and `tgt_in` is detected here and turned into masks.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("cfg.vocab_size must be set before building the model")
        problems = cfg.problems()
        if problems:
            raise ValueError("; ".join(f"{k}: {m}" for k, m in problems))
        self.cfg = cfg
        self.embed = TransformerEmbedding(
            cfg.vocab_size, cfg.d_model, cfg.max_positions, cfg.dropout
        )
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.loss_chunking: LossChunking | None = None  # None: a CPU's (model/loss.py)
        # Pass a source mask (all-attend where nothing is padded: the same outputs) also for a
        # batch without padding. Set where compiled: a mask that is a tensor in one batch and
        # None in the next is another graph, compiled again (~3 s of CPU per layer stack at
        # d_model 32; the whole model under `train.compile: true`, where the host's `padded`
        # flag would be a guard as well).
        self.source_mask_always = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The initialisation of fairseq's Transformer (the paper gives none), biases zero:

        - attention: Q, K and V projections xavier-uniform as one packed (3D, D) in-projection
          (bound sqrt(6 / 4D), as torch.nn.MultiheadAttention and fairseq draw them), the
          output projection xavier-uniform (D, D);
        - feed-forward: torch's default Linear init, U(+-1 / sqrt(fan_in));
        - embeddings N(0, d^-0.5), padding row zero; LayerNorms (1, 0).

        Xavier-uniform per (D, D) projection instead (sqrt(2) larger Q/K/V, so attention logits
        twice as large, and a 2.2x larger second feed-forward layer) trains worse under the
        same recipe: on the demo preset, 0.8 nats higher training nll at step 140 with the
        same batches and optimizer (bench/peer_fairseq.py, bench/RESULTS.md).
        With cfg.init_std set, every linear weight and the embedding are N(0, init_std) instead.
        """
        std = self.cfg.init_std
        for module in self.modules():
            if isinstance(module, (MultiHeadAttention, FeedForward)):
                module.reset_parameters(std)
        self.embed.reset_parameters(std)

    def set_attention_backends(self, backends: Sequence[SDPBackend] | None) -> None:
        """The SDPA kernels every attention sublayer may use (None: torch's own choice)."""
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.sdpa_backends = tuple(backends) if backends else None

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Keep only each layer's input in training and recompute the layer in backward:
        activation memory per layer drops to one (B, T, D) tensor for about a third more
        compute. The recomputation replays the same dropout masks, so results are unchanged."""
        self.encoder.checkpoint_layers = enabled
        self.decoder.checkpoint_layers = enabled

    def size_loss_for(self, device: torch.device) -> LossChunking:
        """Cut the training loss for `device` (model.config.loss_chunking): by a CUDA device's
        memory, as a CPU's otherwise."""
        memory = None
        if device.type == "cuda":
            memory = torch.cuda.get_device_properties(device).total_memory
        self.loss_chunking = loss_chunking(memory)
        return self.loss_chunking

    def compile_layers(self, **kwargs: object) -> None:
        """torch.compile each encoder and decoder layer in place (`train.compile: layers`), as
        regions: the layers of a stack share their code, so one graph (per stack, grad mode and
        shape class) serves all of them and compiling costs about one layer's time, not the
        model's. Embeddings, masks and the chunked loss stay eager; decoding with a cache runs
        the layers eagerly (its shapes change every step). Parameter names are unchanged. The
        source mask is passed for every batch (`source_mask_always`), so that batches with and
        without padding share the graph."""
        self.source_mask_always = True
        for layer in (*self.encoder.layers, *self.decoder.layers):
            layer.compile(**kwargs)

    def output_projection(self, h: Tensor) -> Tensor:
        """Decoder states (B, T, D) -> logits (B, T, V) through the shared embedding."""
        return F.linear(h, self.embed.weight)  # (B, T, V)

    def encode(self, src: Tensor, padded: bool | None = None) -> EncoderOut:
        """src (B, S) token ids, PAD_ID-padded -> EncoderOut(out (B, S, D), src_pad_mask).

        `padded`: whether any row of `src` holds padding, as the caller knows it (a training
        batch says so on the host); None looks at `src` (one device-to-host sync).
        """
        if self.source_mask_always:
            src_pad_mask: Tensor | None = src.eq(PAD_ID)  # (B, S), maybe all False
        else:
            if padded is None:
                padded = bool(src.eq(PAD_ID).any())
            src_pad_mask = src.eq(PAD_ID) if padded else None  # (B, S)
        x = self.embed(src)  # (B, S, D)
        return EncoderOut(self.encoder(x, src_pad_mask), src_pad_mask)

    def decode_hidden(
        self,
        tgt_in: Tensor,
        enc: EncoderOut,
        cache: DecoderCache | None = None,
        right_padded: bool = False,
    ) -> Tensor:
        """Like `decode` but stops before the output projection: (B, T, D).

        `right_padded` is the training path (see Decoder.forward): no look at `tgt_in`'s
        padding at all."""
        offset = cache.length if cache is not None else 0
        y = self.embed(tgt_in, offset=offset)  # (B, T, D)
        if right_padded and cache is None:
            return self.decoder(y, enc.out, enc.src_pad_mask, None, right_padded=True)
        tgt_pad_mask = tgt_in.eq(PAD_ID)  # (B, T)
        if cache is None and not bool(tgt_pad_mask.any()):
            tgt_pad_mask = None
        return self.decoder(y, enc.out, enc.src_pad_mask, tgt_pad_mask, cache)

    def decode(self, tgt_in: Tensor, enc: EncoderOut, cache: DecoderCache | None = None) -> Tensor:
        """tgt_in (B, T) -> logits (B, T, V) in the model dtype.

        Without a cache `tgt_in` is the whole prefix (starting with BOS_ID). With a cache it
        holds only the positions after those already cached; the cache is updated in place.
        """
        return self.output_projection(self.decode_hidden(tgt_in, enc, cache))

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        target: Tensor | None = None,
        epsilon: float = 0.0,
        src_padded: bool | None = None,
    ) -> Tensor | tuple[Tensor, Tensor, Tensor]:
        """Teacher-forced pass.

        src (B, S), tgt_in (B, T) -> logits (B, T, V), every position masked as `decode` does.
        With `target` (B, T) - the training path - instead the label-smoothed loss sums (loss,
        nll, non-pad tokens) of model/loss.py: targets are taken as right-padded (decoder
        self-attention by SDPA's is_causal; padded positions are not scored), and the loss is
        computed in chunks from the decoder states, so the (B, T, V) logits never exist whole.
        `src_padded` is the batch's own knowledge of its padding (None: look at `src`).
        """
        enc = self.encode(src, src_padded)
        if target is None:
            return self.decode(tgt_in, enc)  # (B, T, V)
        h = self.decode_hidden(tgt_in, enc, right_padded=True)  # (B, T, D)
        return chunked_label_smoothed_loss(
            h, self.embed.weight, target, epsilon, chunking=self.loss_chunking
        )
