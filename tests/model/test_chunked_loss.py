"""The chunked label-smoothed loss gives the loss and the gradients of the logits path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import model.loss as loss_module
from model.config import PAD_ID
from model.loss import chunked_label_smoothed_loss, label_smoothed_loss


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(3, 7, 16, generator=g)  # (B, T, D)
    weight = torch.randn(50, 16, generator=g) * 0.3  # (V, D)
    target = torch.randint(4, 50, (3, 7), generator=g)  # (B, T)
    target[0, 5:] = PAD_ID
    target[2, 2:] = PAD_ID
    return h, weight, target


@pytest.mark.parametrize("chunk_elements", [2**24, 50 * 4, 50])  # one chunk, 4 rows, 1 row
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("slice_rows", [4096, 16])  # W's gradient whole, in 4 slices of V
def test_same_loss_and_gradients_as_the_logits_path(
    monkeypatch: pytest.MonkeyPatch, chunk_elements: int, epsilon: float, slice_rows: int
) -> None:
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", chunk_elements)
    monkeypatch.setattr(loss_module, "W_SLICE_ROWS", slice_rows)
    h, weight, target = inputs()
    h1, w1 = h.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = label_smoothed_loss(F.linear(h1, w1), target, epsilon)
    (ref[0] * 0.37).backward()
    h2, w2 = h.clone().requires_grad_(), weight.clone().requires_grad_()
    ours = chunked_label_smoothed_loss(h2, w2, target, epsilon)
    (ours[0] * 0.37).backward()
    for a, b in zip(ref, ours, strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=1e-6, atol=1e-6)
    assert h1.grad is not None and h2.grad is not None
    assert torch.allclose(h1.grad, h2.grad, rtol=1e-6, atol=1e-6)
    assert torch.allclose(w1.grad, w2.grad, rtol=1e-6, atol=1e-6)  # type: ignore[arg-type]
    assert h2.grad[0, 5:].abs().max() == 0  # padding gets no gradient


def test_evaluation_computes_no_gradients() -> None:
    h, weight, target = inputs(1)
    with torch.no_grad():
        loss, nll, ntok = chunked_label_smoothed_loss(h, weight, target, 0.1)
    ref = label_smoothed_loss(F.linear(h, weight), target, 0.1)
    assert torch.allclose(loss, ref[0]) and torch.allclose(nll, ref[1]) and ntok == ref[2]


def test_bf16_is_close_to_fp32() -> None:
    h, weight, target = inputs(2)
    h16, w16 = h.bfloat16().requires_grad_(), weight.bfloat16().requires_grad_()
    loss16, *_ = chunked_label_smoothed_loss(h16, w16, target, 0.1)
    loss16.backward()
    h32, w32 = h.clone().requires_grad_(), weight.clone().requires_grad_()
    loss32, *_ = chunked_label_smoothed_loss(h32, w32, target, 0.1)
    loss32.backward()
    assert abs(loss16.item() - loss32.item()) / loss32.item() < 2e-2
    assert h16.grad is not None and h16.grad.dtype == torch.bfloat16
    assert torch.allclose(h16.grad.float(), h32.grad, atol=2e-2)  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk_elements", [2**24, 50 * 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("slice_rows", [4096, 16])
def test_low_precision_path_matches_fp32_on_the_same_inputs(
    monkeypatch: pytest.MonkeyPatch, chunk_elements: int, dtype: torch.dtype, slice_rows: int
) -> None:
    """The bf16 / fp16 path (softmax in the compute dtype, loss terms from identities) against
    the fp32 path on the very same (rounded) inputs: sums within 1e-3 relative (P's target
    column is rounded once), gradients within the compute dtype's rounding of P (2e-2 of
    each gradient's norm), padding rows without gradient."""
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", chunk_elements)
    monkeypatch.setattr(loss_module, "W_SLICE_ROWS", slice_rows)
    h, weight, target = inputs(3)
    h16, w16 = h.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
    low = chunked_label_smoothed_loss(h16, w16, target, 0.1)
    low[0].backward()
    h32 = h16.detach().float().requires_grad_()
    w32 = w16.detach().float().requires_grad_()
    ref = chunked_label_smoothed_loss(h32, w32, target, 0.1)
    ref[0].backward()
    assert low[0].dtype == torch.float32 and low[2] == ref[2]
    for a, b in zip(low[:2], ref[:2], strict=True):
        assert abs(a.item() - b.item()) <= 1e-3 * abs(b.item())
    for a, b in ((h16.grad, h32.grad), (w16.grad, w32.grad)):
        assert a is not None and b is not None and a.dtype == dtype
        assert (a.float() - b).norm() <= 2e-2 * b.norm()
    assert h16.grad is not None and h16.grad[0, 5:].abs().max() == 0


def test_low_precision_nll_is_capped_not_infinite() -> None:
    """A target whose probability underflows fp32 reads nll 87.3 (fp32's smallest normal
    number), not inf."""
    h = torch.zeros(1, 1, 4, dtype=torch.bfloat16)
    h[..., 0] = 1.0
    weight = torch.zeros(6, 4, dtype=torch.bfloat16)
    weight[5, 0] = 200.0  # token 5 takes all the mass; the target 4 gets e^-200
    target = torch.tensor([[4]])
    _, nll, _ = chunked_label_smoothed_loss(h, weight, target, 0.0)
    assert nll.item() == pytest.approx(-torch.log(torch.tensor(torch.finfo(torch.float32).tiny)))


def test_a_gpu_takes_the_whole_micro_batch_in_one_chunk_and_a_cpu_keeps_64_mib() -> None:
    """The rule of model.config.loss_chunking: a CPU's chunk is 2^24 logits with 4,096-row
    products; an 80 GB GPU's holds the big model's MLPerf micro-batch (13,824 tokens x 37,000)
    whole, with one product for W's gradient; a small GPU's never drops under a CPU's."""
    from model.config import LOSS_CHUNK_ELEMENTS, LossChunking, loss_chunking

    assert loss_chunking(None) == LossChunking(LOSS_CHUNK_ELEMENTS, 4096)
    h100 = loss_chunking(80e9)
    assert h100.w_slice_rows is None and h100.elements >= 13_824 * 37_000
    assert 13_824 * 37_000 // h100.elements == 0  # one chunk
    assert loss_chunking(1e8).elements == LOSS_CHUNK_ELEMENTS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_device_sized_loss_equals_the_chunked_one(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """A GPU's chunking (one chunk, W's gradient in one product), passed as the model passes
    it, against the CPU's cut into 1-row chunks and 16-row slices: equal values and
    gradients (fp32 to 1e-6; bf16: sums to 1e-3, gradients to 1e-2 of their norm, bf16's
    rounding of each chunk's product before its fp32 accumulation)."""
    from model.config import loss_chunking

    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 50)
    monkeypatch.setattr(loss_module, "W_SLICE_ROWS", 16)
    h, weight, target = inputs(4)
    results = []
    for chunking in (loss_chunking(80e9), None):
        hx, wx = h.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
        out = chunked_label_smoothed_loss(hx, wx, target, 0.1, chunking=chunking)
        out[0].backward()
        results.append((out, hx.grad, wx.grad))
    (big, hg_big, wg_big), (small, hg_small, wg_small) = results
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    for a, b in zip(big[:2], small[:2], strict=True):
        assert abs(a.item() - b.item()) <= tol * max(1.0, abs(b.item()))
    assert big[2] == small[2]
    grad_tol = 1e-6 if dtype == torch.float32 else 1e-2
    for a, b in ((hg_big, hg_small), (wg_big, wg_small)):
        assert a is not None and b is not None
        assert (a.float() - b.float()).norm() <= grad_tol * max(1.0, b.float().norm().item())


def test_the_model_sizes_its_loss_for_its_device() -> None:
    """A CPU model keeps the CPU's chunking (the module's settings, which tests change)."""
    from model.config import LossChunking, ModelConfig
    from model.transformer import Transformer

    model = Transformer(ModelConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32,
                                    encoder_layers=1, decoder_layers=1))  # fmt: skip
    assert model.loss_chunking is None
    assert model.size_loss_for(torch.device("cpu")) == LossChunking()
