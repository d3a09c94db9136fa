"""Token embedding scaled by sqrt(d_model), plus fixed sinusoidal position encodings."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from model.config import PAD_ID
from model.dropout import Dropout


def sinusoidal_positions(n_positions: int, d_model: int, offset: int = 0) -> Tensor:
    """The paper's position table, (n_positions, d_model) float32, rows offset..offset+n-1.

    PE(j, 2i) = sin(j / 10000^(2i/d)), PE(j, 2i+1) = cos(j / 10000^(2i/d)): each sine/cosine
    pair shares one frequency, so p_0 = [0, 1, 0, 1, ...]. Fixed rather than learned so that
    it needs no parameters and extends to any length.
    """
    pos = torch.arange(offset, offset + n_positions, dtype=torch.float64)[:, None]  # (N, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (N, D/2)
    table = torch.empty(n_positions, d_model, dtype=torch.float64)  # (N, D)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


class TransformerEmbedding(nn.Module):
    """x_j = sqrt(d_model) * E[token_j] + p_j, then dropout.

    Owns the single vocab x d_model matrix E that the Transformer shares between source,
    target and the output projection. The sqrt(d_model) factor offsets the N(0, d^-0.5)
    initialisation, so embeddings and positions start at comparable scale.
    """

    def __init__(self, vocab_size: int, d_model: int, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.d_model = d_model
        self.scale = math.sqrt(d_model)
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        # Not a parameter and not saved: it is a pure function of the shapes.
        self.register_buffer(
            "positions", sinusoidal_positions(max_positions, d_model), persistent=False
        )
        self.dropout = Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self, std: float | None = None) -> None:
        """N(0, std) with std = d_model^-0.5 by default; the padding row is zero."""
        nn.init.normal_(self.weight, mean=0.0, std=self.d_model**-0.5 if std is None else std)
        with torch.no_grad():
            self.weight[PAD_ID].zero_()

    def position_table(self, length: int, offset: int, device: torch.device) -> Tensor:
        """Rows offset..offset+length-1 of the position table, (length, D)."""
        if offset + length <= self.positions.shape[0]:
            return self.positions[offset : offset + length]
        return sinusoidal_positions(length, self.d_model, offset).to(device)

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """tokens (B, T) int64 -> (B, T, D); the first token is at position `offset`."""
        x = nn.functional.embedding(tokens, self.weight) * self.scale  # (B, T, D)
        pe = self.position_table(tokens.shape[1], offset, tokens.device)  # (T, D)
        return self.dropout(x + pe.to(x.dtype))
