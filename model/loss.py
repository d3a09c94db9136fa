"""Label-smoothed cross-entropy, summed over non-padding target tokens."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from model.config import LOSS_CHUNK_ELEMENTS, LOSS_W_SLICE_ROWS, PAD_ID, LossChunking


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
    their fp32 copy are ever held for the whole batch. In fp32 each chunk goes through
    `_fp32_chunk`; in bf16 / fp16 through `_low_precision_chunk`, which never makes an fp32
    copy of the (C, V) logits.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, h: Tensor, weight: Tensor, target: Tensor, epsilon: float, pad_id: int,
        chunking: LossChunking | None,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        n, v = h.shape[0], weight.shape[0]
        elements = chunking.elements if chunking else CHUNK_ELEMENTS
        rows = max(1, elements // v)
        need_grads = any(ctx.needs_input_grad[:2])  # not under no_grad (evaluation)
        slice_rows = chunking.w_slice_rows if chunking else W_SLICE_ROWS
        grads = _Grads(h, weight, slice_rows or v) if need_grads else None
        chunk = _fp32_chunk if h.dtype == torch.float32 else _low_precision_chunk
        sums = torch.zeros(2, dtype=torch.float32, device=h.device)  # loss, nll
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            tc = target[start:stop]  # (C,)
            keep = tc.ne(pad_id)  # (C,)
            safe = tc.masked_fill(~keep, 0)  # (C,)
            sums += chunk(h[start:stop], weight, safe, keep, epsilon, grads, start)
        ntok = target.ne(pad_id).sum()
        if grads is None:
            ctx.save_for_backward(h[:0], weight[:0])
        else:
            ctx.save_for_backward(grads.h, grads.finish())
        ctx.mark_non_differentiable(sums[1], ntok)
        return sums[0], sums[1], ntok

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_loss: Tensor, _grad_nll: Tensor, _grad_ntok: Tensor
    ) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_loss.to(grad_h.dtype)
        return grad_h * scale, grad_w * grad_loss.to(grad_w.dtype), None, None, None, None


class _Grads:
    """The gradients of the summed loss for h (N, D) and W (V, D), filled chunk by chunk; W's
    accumulated in fp32 (`finish` gives it in W's dtype)."""

    def __init__(self, h: Tensor, weight: Tensor, slice_rows: int) -> None:
        self.slice_rows = slice_rows  # vocabulary rows of W's gradient per product
        self.h = torch.empty_like(h)  # (N, D)
        self.w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)  # (V, D)
        self.dtype = weight.dtype
        self.w_sum = weight.float().sum(0)  # (D,) column sums of W, for the constant terms

    def finish(self) -> Tensor:
        return self.w.to(self.dtype)


W_SLICE_ROWS = LOSS_W_SLICE_ROWS  # a module global, as CHUNK_ELEMENTS


def _accumulate_w(grads: _Grads, p: Tensor, x: Tensor) -> None:
    """grads.w (V, D) fp32 += p^T @ x for p (C, V) and x (C, D), grads.slice_rows rows of V at a
    time: on a CPU neither the (V, D) product nor an fp32 copy of it is ever whole (adding a
    bf16 tensor into an fp32 one in place makes such a copy on a CPU: 2.3x the loss's peak at
    the base model); a GPU's chunking takes the whole vocabulary in one product."""
    acc, rows = grads.w, grads.slice_rows
    for s in range(0, acc.shape[0], rows):
        acc[s : s + rows].add_(p[:, s : s + rows].t() @ x)  # (S, D)


def _smoothed_sums(nll: Tensor, smooth: Tensor, keep: Tensor, epsilon: float) -> Tensor:
    """(loss sum, nll sum) over the kept rows, fp32."""
    zero = torch.zeros((), dtype=torch.float32, device=nll.device)
    loss = torch.where(keep, (1.0 - epsilon) * nll + epsilon * smooth, zero).sum()
    return torch.stack([loss, torch.where(keep, nll, zero).sum()])


def _fp32_chunk(
    hc: Tensor, weight: Tensor, safe: Tensor, keep: Tensor, epsilon: float,
    grads: _Grads | None, start: int,
) -> Tensor:  # fmt: skip
    """One chunk of rows in fp32: log-probabilities, then d loss / d logits = p - (1 - eps)
    onehot(target) - eps / V, zero at padding."""
    v = weight.shape[0]
    lprobs = F.log_softmax(F.linear(hc, weight).float(), dim=-1)  # (C, V)
    nll = -lprobs.gather(-1, safe[:, None]).squeeze(-1)  # (C,)
    smooth = -lprobs.mean(dim=-1)  # (C,)
    sums = _smoothed_sums(nll, smooth, keep, epsilon)
    if grads is None:
        return sums
    grad = lprobs.exp_().sub_(epsilon / v)  # (C, V), in lprobs' storage
    del lprobs
    grad.scatter_add_(-1, safe[:, None], torch.full_like(nll[:, None], -(1.0 - epsilon)))
    grad.mul_(keep[:, None])
    grad = grad.to(hc.dtype)  # the dtype autograd would hand the projection
    grads.h[start : start + hc.shape[0]] = grad @ weight  # (C, D)
    _accumulate_w(grads, grad, hc)
    return sums


def _low_precision_chunk(
    hc: Tensor, weight: Tensor, safe: Tensor, keep: Tensor, epsilon: float,
    grads: _Grads | None, start: int,
) -> Tensor:  # fmt: skip
    """One chunk of rows in bf16 / fp16, with one pass over the (C, V) logits: their softmax P
    (computed in fp32 inside the kernel, stored in the compute dtype, as the projection's
    gradient is). The loss terms come from P's target column and from identities of h and W:
    z_t = h . W_t, mean_v z = h . mean(W), lse = z_t - log p_t, so nll = -log p_t and
    smooth = lse - mean_v z (p_t is clamped at fp32's smallest normal number: a token's nll
    reads at most 87.3). The gradient's constant -eps / V goes into the matmuls' results
    (-eps / V times the column sums of W, and of h, for W's gradient) instead of a pass over
    P, and the one-hot term into P's target column."""
    v = weight.shape[0]
    probs = torch.softmax(F.linear(hc, weight), dim=-1)  # (C, V) in the compute dtype
    p_t = probs.gather(-1, safe[:, None]).squeeze(-1).float()  # (C,)
    h32 = hc.float()  # (C, D)
    z_t = (h32 * weight[safe].float()).sum(-1)  # (C,)
    mean_z = h32 @ (grads.w_sum if grads else weight.float().sum(0)) / v  # (C,)
    nll = -torch.log(p_t.clamp_min(torch.finfo(torch.float32).tiny))  # (C,)
    sums = _smoothed_sums(nll, z_t + nll - mean_z, keep, epsilon)
    if grads is None:
        return sums
    # the target column: p_t - (1 - eps), written by index (scatter_add_ on bf16 upcasts P)
    flat = probs.view(-1)  # (C * V,)
    at = torch.arange(hc.shape[0], device=hc.device) * v + safe  # (C,)
    flat.index_copy_(0, at, (p_t - (1.0 - epsilon)).to(probs.dtype))
    rows = keep[:, None].to(hc.dtype)  # (C, 1)
    kept_h = hc * rows  # (C, D), padding rows zero
    c = epsilon / v
    grad_h = (probs @ weight).float() - c * grads.w_sum  # (C, D)
    grads.h[start : start + hc.shape[0]] = grad_h.to(hc.dtype) * rows
    _accumulate_w(grads, probs, kept_h)
    grads.w.sub_(c * kept_h.float().sum(0))  # (V, D) - (D,) row
    return sums


def chunked_label_smoothed_loss(
    h: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float,
    pad_id: int = PAD_ID,
    chunking: LossChunking | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """`label_smoothed_loss(h @ weight^T, target, epsilon)` without the (B, T, V) logits.

    h (B, T, D) decoder states, weight (V, D) the output projection (the shared embedding),
    target (B, T). Same sums, in float32, and the same gradients for `h` and `weight`.
    `chunking`: the device's (model.config.loss_chunking); None: this module's CHUNK_ELEMENTS
    and W_SLICE_ROWS (a CPU's).
    """
    if torch.compiler.is_compiling():
        # The chunk loop would be unrolled for this batch's row count B*T, so that every new
        # B*T compiled another graph. The compiler fuses the plain loss instead (it holds the
        # logits in the compute dtype for backward, not the fp32 copy).
        return label_smoothed_loss(F.linear(h, weight), target, epsilon, pad_id)
    b, t, d = h.shape
    with torch.profiler.record_function(PROFILE_REGION):
        return _ProjectedLabelSmoothedLoss.apply(
            h.reshape(b * t, d), weight, target.reshape(b * t), epsilon, pad_id, chunking
        )  # (B*T, D) rows
