"""The CPU dropout (model/dropout.py): the rate and scale it promises, the same mask in backward,
seeded like torch's, and identity outside training."""

from __future__ import annotations

import pytest
import torch

from model.dropout import Dropout, drop_threshold, dropout, scaled_keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_rate_and_scale_keep_the_expectation(p: float) -> None:
    torch.manual_seed(0)
    mask = scaled_keep_mask(torch.Size([1000, 1000]), p, torch.float32)
    t, scale = drop_threshold(p)
    dropped = (mask == 0).float().mean().item()
    exact = (t + 32769) / 65536  # P(int16 <= t)
    assert abs(exact - p) <= 1 / 65536
    assert abs(dropped - exact) < 5 * (exact * (1 - exact) / 1e6) ** 0.5  # 5 sigma
    values = mask.unique().tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(scale)
    assert scale == pytest.approx(1 / (1 - exact))
    assert mask.mean().item() == pytest.approx(1.0, abs=3e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_uses_the_forward_mask_and_seeds_repeat(dtype: torch.dtype) -> None:
    x = torch.randn(37, 53).to(dtype).requires_grad_()  # an odd element count
    torch.manual_seed(5)
    y = dropout(x, 0.2, training=True)
    y.backward(torch.ones_like(y))
    torch.manual_seed(5)
    mask = scaled_keep_mask(x.shape, 0.2, dtype)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y, x.detach() * mask)
    assert torch.equal(x.grad, mask)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.2, training=True), y)  # the default generator's stream


def test_identity_when_not_training_and_extremes() -> None:
    x = torch.randn(4, 5)
    module = Dropout(0.3).eval()
    assert module(x) is x
    assert dropout(x, 0.0, training=True) is x
    assert torch.equal(dropout(x, 1.0, training=True), torch.zeros_like(x))
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)
