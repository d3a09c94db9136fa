"""The lecture's worked examples, computed with the project's own functions."""

from __future__ import annotations

import itertools

import torch

from model.attention import attention, build_attn_mask
from model.embedding import sinusoidal_positions


def test_single_query_attention() -> None:
    q = torch.tensor([[1.0, 0.0]])  # (Tq=1, Dk=2)
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (Tk=2, Dk)
    v = torch.tensor([[2.0, 0.0], [0.0, 2.0]])  # (Tk, Dk)
    z = attention(q[None], k[None], v[None])[0, 0]
    assert torch.allclose(z, torch.tensor([1.34, 0.66]), atol=5e-3)
    w1 = torch.exp(torch.tensor(0.5**0.5)) / (torch.exp(torch.tensor(0.5**0.5)) + 1)
    assert torch.allclose(z, torch.stack([2 * w1, 2 * (1 - w1)]), atol=1e-6)


def test_causal_mask_softmax_row() -> None:
    # d_k = 1 and q_i k_j = k_j makes the scaled scores of every row equal to [1, 1, 5];
    # identity values make the outputs equal to the attention weights.
    q = torch.ones(1, 3, 1)  # (1, T, Dk)
    k = torch.tensor([1.0, 1.0, 5.0]).view(1, 3, 1)  # (1, T, Dk)
    v = torch.eye(3)[None]  # (1, T, T)
    mask = build_attn_mask(None, 3, 3, causal=True)
    weights = attention(q[:, None], k[:, None], v[:, None], attn_mask=mask)[0, 0]  # (T, T)
    assert torch.allclose(weights[1], torch.tensor([0.5, 0.5, 0.0]), atol=1e-6)
    unmasked = attention(q[:, None], k[:, None], v[:, None])[0, 0]
    assert torch.allclose(unmasked[1], torch.tensor([0.018, 0.018, 0.965]), atol=1e-3)


def test_position_zero_alternates() -> None:
    p = sinusoidal_positions(4, 512)
    expected = torch.tensor([0.0, 1.0]).repeat(256)
    assert torch.equal(p[0], expected)


def test_position_distance_grows_with_offset() -> None:
    p = sinusoidal_positions(40, 512)
    for j in (0, 7, 20):
        dist = [torch.linalg.norm(p[j] - p[j + d]).item() for d in range(0, 15)]
        assert all(a < b for a, b in itertools.pairwise(dist))
        # symmetric: depends only on |j - k|
        assert abs(dist[5] - torch.linalg.norm(p[30] - p[25]).item()) < 1e-4
