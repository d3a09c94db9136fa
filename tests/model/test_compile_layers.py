"""`train.compile: layers`: each encoder and decoder layer compiled as a region gives the eager
model's loss and gradients, one graph serves all the layers of a stack and batches with and
without padding, and decoding with a cache
stays eager and gives the same tokens.

Each case runs in a fresh interpreter, so that a crash of compiled code fails the test and not
the pytest worker, and the compile counters start at zero."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import compiled_in_fresh_python

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def compare(dtype_name: str) -> dict[str, float]:
    """Eager against compiled layers on one batch, in this process: the loss's relative
    difference, the largest gradient difference relative to the whole gradient's norm, the graphs
    dynamo compiled, and whether greedy decoding gave the same tokens."""
    import copy

    import torch
    from torch._dynamo.utils import counters

    from model.config import ModelConfig
    from model.search import greedy_search
    from model.transformer import Transformer
    from trainer import inductor_cache_for_this_cpu_capability

    inductor_cache_for_this_cpu_capability()
    dtype = getattr(torch, dtype_name)
    cfg = ModelConfig(vocab_size=64, d_model=32, n_heads=2, d_ff=64, encoder_layers=2,
                      decoder_layers=2, dropout=0.0)  # fmt: skip  # compiled dropout: other RNG
    torch.manual_seed(0)
    eager = Transformer(cfg).to(dtype).train()
    compiled = copy.deepcopy(eager)
    compiled.compile_layers(dynamic=True)
    src = torch.randint(4, 64, (4, 9))  # (B, S)
    tgt = torch.randint(4, 64, (4, 8))  # (B, T + 1)
    src[1, 6:] = 0  # padding
    tgt[2, 5:] = 0
    out = {}
    grads = []
    for model in (eager, compiled):
        loss, _, _ = model(src, tgt[:, :-1], tgt[:, 1:], 0.1)
        loss.backward()
        out.setdefault("losses", []).append(float(loss))
        grads.append({n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None})
    a, b = out.pop("losses")
    out["loss_rel"] = abs(a - b) / abs(a)
    # each parameter's gradient difference against the norm of the whole gradient (some
    # gradients are zero but for rounding noise: a key projection's bias moves no softmax)
    total = torch.cat([g.flatten() for g in grads[0].values()]).norm()
    out["grad_rel"] = max(float((grads[0][n] - grads[1][n]).norm() / total) for n in grads[0])
    out["grads"] = float(len(grads[1]) == len(grads[0]) == len(list(eager.parameters())))
    # a batch of other lengths without any padding: the same graphs (the source mask is passed
    # all the same), where a mask of None would compile each stack again
    full_src, full_tgt = torch.randint(4, 64, (3, 7)), torch.randint(4, 64, (3, 6))
    losses = [m(full_src, full_tgt[:, :-1], full_tgt[:, 1:], 0.1, src_padded=False)[0]
              for m in (eager, compiled)]  # fmt: skip
    losses[1].backward()
    out["unpadded_rel"] = abs(float(losses[0]) - float(losses[1])) / abs(float(losses[0]))
    out["graphs"] = float(counters["stats"]["unique_graphs"])
    eager.eval(), compiled.eval()
    with torch.no_grad():
        same = greedy_search(eager, src, 0.0, 12) == greedy_search(compiled, src, 0.0, 12)
    out["same_decode"] = float(same)
    out["graphs_after_decode"] = float(counters["stats"]["unique_graphs"])
    return out


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-5), ("bfloat16", 3e-2)])
def test_compiled_layers_give_the_eager_loss_and_gradients(dtype: str, tol: float) -> None:
    """Tolerances: fp32 1e-5 relative (the compiler fuses and reorders float sums), bf16 3e-2
    (each fused kernel rounds to bf16 once where eager rounds every op)."""
    got = compiled_in_fresh_python(f"tests.model.test_compile_layers:compare({dtype!r})")
    assert isinstance(got, dict)
    assert got["loss_rel"] <= tol and got["grad_rel"] <= tol * 10, got
    assert got["unpadded_rel"] <= tol, got
    assert got["grads"] == 1.0, got  # every parameter got its gradient through the regions
    # one graph per stack (encoder layer, decoder layer), whatever the number of layers, for
    # batches with and without padding
    assert got["graphs"] <= 2, got
    assert got["same_decode"] == 1.0, got
    assert got["graphs_after_decode"] <= 4, got  # evaluation's no-grad graphs at most
