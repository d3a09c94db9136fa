"""Q, K and V (and cross-attention's K and V) as one matrix product: the outputs and gradients of
three separate projections, under the same parameter names, so every checkpoint loads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.attention import KVCache, MultiHeadAttention


def separate(mha: MultiHeadAttention, query: torch.Tensor, key_value: torch.Tensor) -> torch.Tensor:
    """The sublayer as three separate projections: (B, Tq, D)."""
    q, k, v = (
        mha._split(p(x))
        for p, x in ((mha.q_proj, query), (mha.k_proj, key_value), (mha.v_proj, key_value))
    )  # (B, H, T, Dk) each
    z = F.scaled_dot_product_attention(q, k, v)  # (B, H, Tq, Dk)
    b, tq, d = query.shape
    return mha.out_proj(z.transpose(1, 2).reshape(b, tq, d))  # (B, Tq, D)


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"]
)
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_fused_projections_give_the_separate_outputs_and_gradients(
    dtype: torch.dtype, tol: float, kind: str
) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 4).to(dtype)
    x = torch.randn(3, 7, 64, dtype=dtype)
    memory = x if kind == "self" else torch.randn(3, 11, 64, dtype=dtype)
    fused = mha(x, memory)
    fused.float().square().sum().backward()
    fused_grads = {n: p.grad.clone() for n, p in mha.named_parameters()}
    mha.zero_grad()
    ref = separate(mha, x, memory)
    ref.float().square().sum().backward()
    torch.testing.assert_close(fused, ref, atol=tol, rtol=tol)
    for name, p in mha.named_parameters():
        scale = p.grad.float().abs().max().item() + 1.0
        torch.testing.assert_close(fused_grads[name], p.grad, atol=tol * scale, rtol=tol)


def test_parameters_keep_their_names_and_a_saved_state_loads_strictly() -> None:
    """Checkpoints written before the fusion (and exports, which name q/k/v) stay valid."""
    mha = MultiHeadAttention(32, 2)
    names = {n for n, _ in mha.named_parameters()}
    assert names == {f"{p}_proj.{w}" for p in ("q", "k", "v", "out") for w in ("weight", "bias")}
    assert mha.q_proj.weight.shape == (32, 32)
    other = MultiHeadAttention(32, 2)
    other.load_state_dict(mha.state_dict(), strict=True)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(other(x, x), mha(x, x), atol=0, rtol=0)


def test_cross_attention_cache_reuses_the_fused_keys_and_values() -> None:
    """Decoding: the first call projects K and V of the memory together; later calls reuse them
    and give what an uncached call gives."""
    torch.manual_seed(1)
    mha = MultiHeadAttention(32, 2).eval()
    memory, y = torch.randn(2, 9, 32), torch.randn(2, 3, 32)
    cache = KVCache()
    first = mha(y[:, :1], memory, cache=cache, static_kv=True)
    assert cache.k is not None and cache.k.shape == (2, 2, 9, 16)
    second = mha(y[:, 1:2], memory, cache=cache, static_kv=True)
    torch.testing.assert_close(first, separate(mha, y[:, :1], memory), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(second, separate(mha, y[:, 1:2], memory), atol=1e-6, rtol=1e-5)
