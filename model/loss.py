"""Label-smoothed cross-entropy, summed over non-padding target tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from model.config import PAD_ID


def label_smoothed_loss(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int = PAD_ID
) -> tuple[Tensor, Tensor, Tensor]:
    """(smoothed loss sum, nll sum, number of non-pad tokens), all computed in float32.

    Per token: (1 - eps) * (-log p(target)) + eps * mean_v(-log p(v)), i.e. cross-entropy
    against a target distribution that moves eps of its mass uniformly onto the vocabulary
    (fairseq's convention). Sums rather than means let the trainer normalise by the token
    count of the whole (possibly accumulated / multi-GPU) batch. The nll is returned for
    perplexity reporting. logits (B, T, V), target (B, T).
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    keep = target.ne(pad_id)  # (B, T)
    safe_target = target.masked_fill(~keep, 0)  # (B, T) valid index everywhere
    nll = -lprobs.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    smooth = -lprobs.mean(dim=-1)  # (B, T)
    loss = (1.0 - epsilon) * nll + epsilon * smooth  # (B, T)
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    loss_sum = torch.where(keep, loss, zero).sum()
    nll_sum = torch.where(keep, nll, zero).sum()
    return loss_sum, nll_sum, keep.sum()
