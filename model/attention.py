"""Multi-head scaled dot-product attention, with an optional key/value cache for decoding.

Shape legend (used in every shape comment of this package):
    B   batch size (sentences, or sentences x beams during beam search)
    S   source length (encoder positions)
    T   target length (decoder positions fed in this call)
    L   decoder positions already held in a key/value cache
    Tq  query length, Tk key length (Tq = Tk for self-attention without a cache)
    D   d_model
    H   number of heads
    Dk  per-head size, D / H
    V   vocabulary size

Masks follow torch.nn.functional.scaled_dot_product_attention: a boolean `attn_mask`
broadcastable to (B, H, Tq, Tk) where True means "may attend". Padding masks elsewhere in
the package use the opposite convention (True = pad), matching torch.nn.Transformer's
`key_padding_mask`; `build_attn_mask` converts between the two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

# `train.attention` names of torch's SDPA kernels (trainer/kernels.py chooses among them)
SDPA_BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


@dataclass
class KVCache:
    """Projected keys and values of one attention sublayer, kept between decoding steps.

    For self-attention the tensors grow by the new positions at each step; for cross-attention
    they are computed once from the encoder output and then only reused.
    """

    k: Tensor | None = None  # (B, H, Tk, Dk)
    v: Tensor | None = None  # (B, H, Tk, Dk)

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` of the batch (in that order), in place; used by beam search."""
        if self.k is not None and self.v is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    backends: Sequence[SDPBackend] | None = None,
) -> Tensor:
    """softmax(q k^T / sqrt(d_k)) v for (..., Tq, Dk) queries and (..., Tk, Dk) keys/values.

    A thin wrapper over torch's fused kernel, so that one function is the single definition of
    attention used by the model and by the tests of the lecture's worked examples.
    `attn_mask` is boolean, True = may attend; every query row must allow at least one key
    (`build_attn_mask` guarantees it), otherwise the softmax of that row is NaN. `is_causal`
    (without a mask) lets query i see keys 0..i: the one form the flash kernel takes.
    `backends`: the SDPA kernels torch may pick from (None: torch's own choice); the kernel
    chosen for the forward pass also computes the backward.
    """
    with sdpa_kernel(list(backends)) if backends else nullcontext():
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
        )


def build_attn_mask(
    key_pad: Tensor | None,
    tq: int,
    tk: int,
    causal: bool,
    offset: int = 0,
    device: torch.device | None = None,
) -> Tensor | None:
    """Boolean mask (B or 1, 1, Tq, Tk), True = may attend, or None when nothing is masked.

    key_pad: (B, Tk) bool, True where the key is padding. causal: query i (absolute position
    offset + i) may only see keys at positions <= offset + i. Query rows that would see no key
    at all (a fully padded sequence, or padding before any real token) are let through to
    every key: their outputs are meaningless but finite, so no NaN can leak into gradients.
    """
    if key_pad is None and not causal:
        return None
    if causal and key_pad is None and tq == 1 and offset + 1 >= tk:
        return None  # one new query at the end sees every cached key
    mask: Tensor | None = None
    if key_pad is not None:
        mask = (~key_pad)[:, None, None, :]  # (B, 1, 1, Tk)
    if causal:
        device = key_pad.device if key_pad is not None else device
        qpos = torch.arange(tq, device=device)[:, None] + offset  # (Tq, 1)
        kpos = torch.arange(tk, device=device)[None, :]  # (1, Tk)
        causal_mask = (kpos <= qpos)[None, None]  # (1, 1, Tq, Tk)
        mask = causal_mask if mask is None else mask & causal_mask  # (B, 1, Tq, Tk)
    assert mask is not None
    empty = ~mask.any(dim=-1, keepdim=True)  # (B, 1, Tq, 1)
    return mask | empty


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W_O with head_i = Attention(Q W_Q^i, ...).

    The h per-head projections of size d_k = d_model / h are stored as one d_model x d_model
    linear layer each for Q, K and V (with biases, as in torch.nn.MultiheadAttention), so the
    cost matches one full-size single head, as the paper notes. Projections of one input run
    as one matrix product: Q, K and V of self-attention (a (3D, D) weight), K and V of
    cross-attention ((2D, D)), the weights concatenated at each call, so parameter names,
    checkpoints and exports are those of three separate layers.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.sdpa_backends: tuple[SDPBackend, ...] | None = None  # None: torch's choice
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.reset_parameters()

    def reset_parameters(self, std: float | None = None) -> None:
        """Q, K, V: xavier-uniform as one packed (3D, D) matrix, i.e. bound sqrt(6 / 4D) each
        (torch.nn.MultiheadAttention's and fairseq's init); output: xavier-uniform (D, D);
        biases zero. With `std`, every weight is N(0, std)."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if std is not None:
                nn.init.normal_(proj.weight, mean=0.0, std=std)
            elif proj is self.out_proj:
                nn.init.xavier_uniform_(proj.weight)
            else:
                nn.init.xavier_uniform_(proj.weight, gain=math.sqrt(0.5))  # packed (3D, D)
            nn.init.zeros_(proj.bias)

    def _split(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, Dk); x may be a slice of a wider product's last dimension."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dk)

    def _project(self, x: Tensor, projs: tuple[nn.Linear, ...]) -> list[Tensor]:
        """x (B, T, D) through each of `projs` as one (B*T, D) x (D, P*D) product: P heads-split
        (B, H, T, Dk) results, as the separate layers give them."""
        if len(projs) == 1:
            return [self._split(projs[0](x))]
        weight = torch.cat([p.weight for p in projs])  # (P*D, D)
        bias = torch.cat([p.bias for p in projs])  # (P*D,)
        y = F.linear(x, weight, bias)  # (B, T, P*D)
        return [self._split(part) for part in y.split(self.d_model, dim=-1)]  # P x (B, H, T, Dk)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor,
        attn_mask: Tensor | None = None,
        cache: KVCache | None = None,
        static_kv: bool = False,
        is_causal: bool = False,
    ) -> Tensor:
        """Attend from `query` (B, Tq, D) to `key_value` (B, Tk, D); returns (B, Tq, D).

        is_causal (self-attention without a mask or cache): query i sees keys 0..i.
        cache: when given, self-attention (static_kv False) appends this call's keys/values to
        it and attends over everything cached; cross-attention (static_kv True) projects
        `key_value` only on the first call and reuses the cached projection afterwards.
        """
        b, tq, _ = query.shape
        if cache is not None and static_kv and cache.k is not None and cache.v is not None:
            (q,) = self._project(query, (self.q_proj,))  # (B, H, Tq, Dk)
            k, v = cache.k, cache.v  # (B, H, S, Dk)
        else:
            if key_value is query:  # self-attention: one product for Q, K and V
                q, k, v = self._project(query, (self.q_proj, self.k_proj, self.v_proj))
            else:
                (q,) = self._project(query, (self.q_proj,))  # (B, H, Tq, Dk)
                k, v = self._project(key_value, (self.k_proj, self.v_proj))  # (B, H, Tk, Dk)
            if cache is not None:
                if not static_kv and cache.k is not None and cache.v is not None:
                    k = torch.cat([cache.k, k], dim=2)  # (B, H, L + Tq, Dk)
                    v = torch.cat([cache.v, v], dim=2)  # (B, H, L + Tq, Dk)
                cache.k, cache.v = k, v
        p = self.dropout if self.training else 0.0
        z = attention(q, k, v, attn_mask, p, is_causal, self.sdpa_backends)  # (B, H, Tq, Dk)
        z = z.transpose(1, 2).reshape(b, tq, self.d_model)  # (B, Tq, D)
        return self.out_proj(z)
