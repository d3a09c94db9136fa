"""Encoder and decoder layers: attention / feed-forward sublayers with residual + LayerNorm.

Post-LN (the paper): x = LayerNorm(x + Dropout(Sublayer(x))).
Pre-LN (cfg.pre_norm): x = x + Dropout(Sublayer(LayerNorm(x))); the stacks then add one
final LayerNorm, since the residual stream itself is never normalised.
"""

from __future__ import annotations

from torch import Tensor, nn

from model.attention import KVCache, MultiHeadAttention
from model.config import ModelConfig
from model.dropout import Dropout


class FeedForward(nn.Module):
    """FFN(x) = W_2 ReLU(W_1 x + b_1) + b_2, applied to every position alike."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(activation_dropout)
        self.reset_parameters()

    def reset_parameters(self, std: float | None = None) -> None:
        """torch's default Linear weights, U(+-1 / sqrt(fan_in)) (fairseq's feed-forward init),
        zero biases; with `std`, N(0, std) weights."""
        for linear in (self.linear1, self.linear2):
            if std is None:
                linear.reset_parameters()
            else:
                nn.init.normal_(linear.weight, mean=0.0, std=std)
            nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, D)."""
        return self.linear2(self.dropout(self.linear1(x).relu()))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in residual + LayerNorm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.pre_norm = cfg.pre_norm
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: Tensor, attn_mask: Tensor | None) -> Tensor:
        """x (B, S, D), attn_mask (B, 1, S, S) or None -> (B, S, D)."""
        if self.pre_norm:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, attn_mask))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, x, attn_mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder output, then feed-forward."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.pre_norm = cfg.pre_norm
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.norm3 = nn.LayerNorm(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)

    def forward(
        self,
        y: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        causal: bool = False,
    ) -> Tensor:
        """y (B, T, D), memory (B, S, D), self_mask (B, 1, T, L+T), cross_mask (B, 1, 1, S).

        Returns (B, T, D). With caches, `y` holds only the new positions. `causal` (with no
        self_mask): self-attention by SDPA's is_causal, exact for right-padded targets.
        """
        if self.pre_norm:
            h = self.norm1(y)
            y = y + self.dropout(self.self_attn(h, h, self_mask, self_cache, is_causal=causal))
            h = self.norm2(y)
            y = y + self.dropout(self.cross_attn(h, memory, cross_mask, cross_cache, True))
            return y + self.dropout(self.ffn(self.norm3(y)))
        y = self.norm1(y + self.dropout(self.self_attn(y, y, self_mask, self_cache, False, causal)))
        y = self.norm2(y + self.dropout(self.cross_attn(y, memory, cross_mask, cross_cache, True)))
        return self.norm3(y + self.dropout(self.ffn(y)))
