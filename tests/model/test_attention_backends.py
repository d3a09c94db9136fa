"""The SDPA kernels a run may choose (trainer/kernels.py) compute the same attention: outputs
and gradients of each kernel against the math kernel, in fp32 and bf16, for the three forms the
model uses (causal self-attention, padded keys, no mask), and a whole model's loss and
gradients. Tolerances: fp32 1e-5 (absolute, on values of order 1), bf16 2e-2 (bf16 keeps 8
bits of mantissa: 4e-3 relative per rounding, and the kernels round in different places)."""

from __future__ import annotations

import pytest
import torch

from model.attention import SDPA_BACKENDS, attention, build_attn_mask
from model.config import ModelConfig
from model.transformer import Transformer
from trainer.config import ATTENTION_NAMES
from trainer.kernels import resolve_attention, sdpa_backends

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
CPU_KERNELS = ["math", "flash"]  # the SDPA kernels torch has for the CPU


def qkv(dtype: torch.dtype, b: int = 6, h: int = 4, t: int = 19, dk: int = 16) -> list:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, h, t, dk, generator=g).to(dtype).requires_grad_() for _ in range(3)]


def forms(b: int = 6, t: int = 19) -> dict[str, dict]:
    pad = torch.zeros(b, t, dtype=torch.bool)
    pad[1, 12:] = True
    pad[4, 3:] = True
    return {
        "causal": {"is_causal": True},
        "padded keys": {"attn_mask": build_attn_mask(pad, t, t, causal=False)},
        "no mask": {},
    }


def run(kernel: str, dtype: torch.dtype, form: dict) -> tuple[torch.Tensor, ...]:
    q, k, v = qkv(dtype)
    out = attention(q, k, v, backends=sdpa_backends(kernel), **form)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(dtype)
    (out * weights).sum().backward()
    return out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("form", list(forms()))
@pytest.mark.parametrize("kernel", CPU_KERNELS)
def test_every_cpu_kernel_matches_math(kernel: str, form: str, dtype: torch.dtype) -> None:
    reference = run("math", torch.float32, forms()[form])
    got = run(kernel, dtype, forms()[form])
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, reference, strict=True):
        err = (a - b).abs().max().item()
        assert err <= TOLERANCE[dtype], f"{kernel} {form} {name}: max abs error {err:.2e}"


def model_loss_and_grads(kernel: str, dtype: torch.dtype) -> tuple[float, list[torch.Tensor]]:
    cfg = ModelConfig(
        d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
        vocab_size=50,
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 50, (5, 11), generator=g), torch.randint(4, 50, (5, 9), generator=g)
    src[2, 7:] = 0  # padding: the encoder's and the cross-attention's mask
    torch.manual_seed(0)
    model = Transformer(cfg).to(dtype)
    model.set_attention_backends(sdpa_backends(kernel))
    loss, _, _ = model(src, tgt[:, :-1], tgt[:, 1:], 0.1)
    loss.backward()
    return loss.item(), [p.grad.float() for p in model.parameters()]


def gradient_error(grads: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The largest per-parameter difference, relative to that parameter's gradient or to a
    thousandth of the whole gradient's norm: the key projections' biases have a gradient of
    exactly 0 (softmax ignores what a query adds to every key alike), so their rounding noise
    has no scale of its own."""
    floor = 1e-3 * torch.cat([r.flatten() for r in reference]).norm()
    return max(
        ((a - r).norm() / torch.maximum(r.norm(), floor)).item()
        for a, r in zip(grads, reference, strict=True)
    )


def test_a_model_trains_the_same_under_either_cpu_kernel() -> None:
    """fp32: flash equals math within 1e-5. bf16: each kernel against the fp32 reference is as
    close as the other (within 1.5x of its error, both under 0.1)."""
    ref_loss, ref_grads = model_loss_and_grads("math", torch.float32)
    loss, grads = model_loss_and_grads("flash", torch.float32)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert gradient_error(grads, ref_grads) <= TOLERANCE[torch.float32]
    errors = {}
    for kernel in CPU_KERNELS:
        loss, grads = model_loss_and_grads(kernel, torch.bfloat16)
        assert loss == pytest.approx(ref_loss, rel=1e-2)
        errors[kernel] = gradient_error(grads, ref_grads)
    assert max(errors.values()) <= 0.1, errors
    assert max(errors.values()) <= 1.5 * min(errors.values()) + 1e-3, errors


def test_names_and_the_rule() -> None:
    assert ("auto", "default", *SDPA_BACKENDS) == ATTENTION_NAMES
    assert resolve_attention("auto", "cpu", "bf16").name == "math"
    assert resolve_attention("auto", "cpu", "fp32").name == "flash"
    assert resolve_attention("auto", "cuda", "bf16").name == "default"
    assert resolve_attention("flash", "cpu", "bf16").name == "flash"
    assert sdpa_backends("default") is None
