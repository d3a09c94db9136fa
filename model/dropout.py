"""Dropout whose random mask costs a fifth of torch's on a CPU.

torch's CPU dropout draws one Mersenne-Twister number per element (`bernoulli_`), then divides
the mask and multiplies: about 2.3 ms for a (1536, 256) bf16 activation, a tenth of the demo
preset's step in all. Here one 64-bit draw gives four 16-bit numbers, compared with a threshold
by a clamp (a bool mask converts to bf16 slowly; int16 converts fast), giving the scaled mask in
the activation's dtype: 0.67 ms for the same tensor (bench/RESULTS.md, `dropout`). An element
is dropped with probability round(p * 65536) / 65536 (0.100006 for p = 0.1), and kept ones are
scaled by the inverse of the exact keep probability, so the expectation is unchanged.

The mask comes from torch's default generator, so seeding, checkpointed RNG states and
activation checkpointing's replay work as for torch's dropout. On CUDA, and under
torch.compile, torch's own (fused) dropout is used.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 65536  # 16-bit random numbers


def drop_threshold(p: float) -> tuple[int, float]:
    """(t, scale): an int16 r drops its element when r <= t; kept ones are multiplied by
    `scale`, the inverse of the keep probability that t gives."""
    dropped = min(max(round(p * _LEVELS), 0), _LEVELS)
    return dropped - _LEVELS // 2 - 1, _LEVELS / max(_LEVELS - dropped, 1)


def scaled_keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> Tensor:
    """A (shape) tensor of 0 (dropped) and 1 / keep-probability, from the default generator."""
    n = shape.numel()
    # all 64 bits random (plain random_() leaves the sign bit 0): four 16-bit numbers per word
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    r = words.view(torch.int16)[:n].view(shape)
    t, scale = drop_threshold(p)
    return r.clamp_(t, t + 1).sub_(t).to(dtype).mul_(scale)  # 0 or 1, then 0 or scale


class _MaskedScale(torch.autograd.Function):
    """x * mask; the gradient is grad * the same mask."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float) -> Tensor:  # type: ignore[override]
        mask = scaled_keep_mask(x.shape, p, x.dtype)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout(x, p, training), with the cheaper mask on a CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling() or p >= 1.0:
        return F.dropout(x, p, training)
    return _MaskedScale.apply(x, p)


class Dropout(nn.Module):
    """nn.Dropout with `dropout`'s mask."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
