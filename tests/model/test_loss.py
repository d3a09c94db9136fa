"""Label-smoothed cross-entropy: padding ignored, eps=0 is plain CE, a hand-computed case."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from model.config import PAD_ID
from model.loss import label_smoothed_loss


def test_epsilon_zero_is_cross_entropy_sum() -> None:
    logits = torch.randn(3, 5, 11)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = PAD_ID
    target[2, 1:] = PAD_ID
    loss, nll, n = label_smoothed_loss(logits, target, 0.0)
    ref = F.cross_entropy(
        logits.view(-1, 11), target.view(-1), ignore_index=PAD_ID, reduction="sum"
    )
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(nll, ref, atol=1e-5)
    assert n.item() == 15 - 2 - 4


def test_padding_is_ignored() -> None:
    logits = torch.randn(2, 4, 7)
    target = torch.tensor([[4, 5, 6, PAD_ID], [3, PAD_ID, PAD_ID, PAD_ID]])
    base = label_smoothed_loss(logits, target, 0.1)
    changed = logits.clone()
    changed[0, 3] += 100 * torch.randn(7)
    changed[1, 1:] = 1e4
    again = label_smoothed_loss(changed, target, 0.1)
    for a, b in zip(base, again, strict=True):
        assert torch.allclose(a, b)


def test_hand_computed_case() -> None:
    # One token, vocabulary of 2 with logits [0, ln 3]: p = [1/4, 3/4]; target 1.
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    target = torch.tensor([[1]])
    loss, nll, n = label_smoothed_loss(logits, target, 0.2, pad_id=-1)
    nll_ref = -math.log(0.75)
    smooth_ref = (-math.log(0.25) - math.log(0.75)) / 2
    assert abs(nll.item() - nll_ref) < 1e-6
    assert abs(loss.item() - (0.8 * nll_ref + 0.2 * smooth_ref)) < 1e-6
    assert n.item() == 1


def test_computed_in_float32_from_half_logits() -> None:
    logits = torch.randn(2, 3, 9).to(torch.bfloat16)
    target = torch.randint(1, 9, (2, 3))
    loss, nll, _ = label_smoothed_loss(logits, target, 0.1)
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32
    ref, _, _ = label_smoothed_loss(logits.float(), target, 0.1)
    assert torch.allclose(loss, ref)
