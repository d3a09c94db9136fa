"""Label-smoothed cross-entropy, summed over non-padding target tokens."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from model.config import LOSS_CHUNK_ELEMENTS, PAD_ID


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


PROFILE_REGION = "paperscale.loss"  # the loss's name in a profiler trace (trainer/step_time.py)
CHUNK_ELEMENTS = LOSS_CHUNK_ELEMENTS  # logits per chunk (a module global: tests change it)


class _ProjectedLabelSmoothedLoss(torch.autograd.Function):
    """Label-smoothed cross-entropy of h @ W^T, chunk by chunk, gradients computed on the way.

    Forward takes rows of `h` in chunks, computes each chunk's logits, the loss terms and the
    gradient of the summed loss with respect to those logits (softmax - target distribution,
    zero at padding), and accumulates the gradients for `h` and `W` from it; only those are
    kept for backward, which scales them by the incoming gradient. So neither the logits nor
    their fp32 copy are ever held for the whole batch.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, h: Tensor, weight: Tensor, target: Tensor, epsilon: float, pad_id: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        n, v = h.shape[0], weight.shape[0]
        rows = max(1, CHUNK_ELEMENTS // v)
        need_grads = any(ctx.needs_input_grad[:2])  # not under no_grad (evaluation)
        grad_h = torch.empty_like(h) if need_grads else h[:0]  # (N, D)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)  # (V, D)
        loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        nll_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        for start in range(0, n, rows):
            hc, tc = h[start : start + rows], target[start : start + rows]  # (C, D), (C,)
            # the fp32 logits live only inside log_softmax: at most two (C, V) fp32 at a time
            lprobs = F.log_softmax(F.linear(hc, weight).float(), dim=-1)  # (C, V)
            keep = tc.ne(pad_id)  # (C,)
            safe = tc.masked_fill(~keep, 0)  # (C,)
            nll = -lprobs.gather(-1, safe[:, None]).squeeze(-1)  # (C,)
            smooth = -lprobs.mean(dim=-1)  # (C,)
            zero = torch.zeros((), dtype=torch.float32, device=h.device)
            loss_sum += torch.where(keep, (1.0 - epsilon) * nll + epsilon * smooth, zero).sum()
            nll_sum += torch.where(keep, nll, zero).sum()
            if not need_grads:
                del lprobs  # before the next chunk's logits
                continue
            # d loss / d logits = p - (1 - eps) onehot(target) - eps / V, zero at padding
            grad = lprobs.exp_().sub_(epsilon / v)  # (C, V), in lprobs' storage
            del lprobs
            grad.scatter_add_(-1, safe[:, None], torch.full_like(nll[:, None], -(1.0 - epsilon)))
            grad.mul_(keep[:, None])
            grad = grad.to(h.dtype)  # the dtype autograd would hand the projection
            grad_h[start : start + rows] = grad @ weight  # (C, D)
            grad_w.add_(grad.t() @ hc)  # (V, D), accumulated in fp32 without an fp32 copy
            del grad  # before the next chunk's logits
        ntok = target.ne(pad_id).sum()
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        ctx.mark_non_differentiable(nll_sum, ntok)
        return loss_sum, nll_sum, ntok

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_loss: Tensor, _grad_nll: Tensor, _grad_ntok: Tensor
    ) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_loss.to(grad_h.dtype)
        return grad_h * scale, grad_w * grad_loss.to(grad_w.dtype), None, None, None


def chunked_label_smoothed_loss(
    h: Tensor, weight: Tensor, target: Tensor, epsilon: float, pad_id: int = PAD_ID
) -> tuple[Tensor, Tensor, Tensor]:
    """`label_smoothed_loss(h @ weight^T, target, epsilon)` without the (B, T, V) logits.

    h (B, T, D) decoder states, weight (V, D) the output projection (the shared embedding),
    target (B, T). Same sums, in float32, and the same gradients for `h` and `weight`.
    """
    if torch.compiler.is_compiling():
        # The chunk loop would be unrolled for this batch's row count B*T, so that every new
        # B*T compiled another graph. The compiler fuses the plain loss instead (it holds the
        # logits in the compute dtype for backward, not the fp32 copy).
        return label_smoothed_loss(F.linear(h, weight), target, epsilon, pad_id)
    b, t, d = h.shape
    with torch.profiler.record_function(PROFILE_REGION):
        return _ProjectedLabelSmoothedLoss.apply(
            h.reshape(b * t, d), weight, target.reshape(b * t), epsilon, pad_id
        )  # (B*T, D) rows
