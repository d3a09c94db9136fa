"""Peak memory of the output projection and label-smoothed loss, forward and backward: plain
(materialised (B, T, V) logits) against chunked (model/loss.py), and the chunked peak against
what `paperscale plan` counts for it (launch/cost_model/activations.py).

At the preset's d_model and vocabulary and `tokens` = B*T of one micro-batch, each case runs
in a fresh process: decoder states and embedding allocated, the resident set read, then one
forward and backward (fp32, and bf16 where native); the figure is the peak resident set above
that baseline.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from bench.common import Row, in_fresh_process, row

VARIANTS = ("plain", "chunked")
# glibc's malloc keeps a freed block below its (dynamic, up to 32 MiB) mmap threshold in the
# heap, where the resident set goes on counting it as if it were live; a fixed 1 MiB threshold
# maps every tensor of note on its own and returns it when freed, so the peak is the live peak.
RETURN_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}


def peak_mib(variant: str, tokens: int, d_model: int, vocab: int, dtype: str) -> float:
    """Run in the child: one forward + backward of `variant`; peak MiB above the baseline."""
    import torch
    import torch.nn.functional as F

    from model.loss import chunked_label_smoothed_loss, label_smoothed_loss

    torch.manual_seed(0)
    cast = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    h = torch.randn(1, tokens, d_model, dtype=cast, requires_grad=True)  # (B=1, T, D)
    weight = (torch.randn(vocab, d_model) * d_model**-0.5).to(cast).requires_grad_()  # (V, D)
    target = torch.randint(4, vocab, (1, tokens))  # (B, T)
    target[0, -tokens // 10 :] = 0  # a tenth padding, as a bucketed batch has at most
    # warm the kernels on a few rows so that their one-time buffers are in the baseline
    for fn in (label_smoothed_loss, chunked_label_smoothed_loss):
        small = (h[:, :8].detach().requires_grad_(), weight.detach().requires_grad_())
        args = (F.linear(small[0], small[1]),) if fn is label_smoothed_loss else small
        fn(*args, target[:, :8], 0.1)[0].backward()
    pages = int(Path("/proc/self/statm").read_text().split()[1])  # the resident set now
    base = pages * os.sysconf("SC_PAGE_SIZE")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if variant == "plain":
        loss, _, n = label_smoothed_loss(F.linear(h, weight), target, 0.1)
    else:
        loss, _, n = chunked_label_smoothed_loss(h, weight, target, 0.1)
    (loss / n).backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if peak <= before:  # the loss never rose above start-up's own peak: not measurable
        raise SystemExit(f"{variant}: peak below start-up's ({before / 2**20:.0f} MiB)")
    return (peak - base) / 2**20


def fresh_peak(
    work: Path, variant: str, tokens: int, d_model: int, vocab: int, dtype: str
) -> float:
    """`peak_mib` in a fresh Python process, with RETURN_FREED_MEMORY."""
    kwargs = {"variant": variant, "tokens": tokens, "d_model": d_model, "vocab": vocab,
              "dtype": dtype}  # fmt: skip
    log = work / f"{variant}-{dtype}.log"
    return in_fresh_process("loss_memory:peak_mib", kwargs, log, RETURN_FREED_MEMORY)


def measure(
    work: Path,
    config: str = "configs/base.yaml",
    tokens: int = 4096,
    d_model: int = 0,
    vocab: int = 0,
) -> list[Row]:
    """Both losses in each dtype, and the plan's count for the chunked one; d_model and vocab 0
    take the preset's."""
    from launch.config import load_config
    from launch.cost_model.activations import activation_bytes_per_token, loss_workspace_bytes
    from model.config import ModelConfig
    from trainer.precision import cpu_has_native_bf16

    job = load_config(config, [])
    d_model = d_model or job.model.d_model
    vocab = vocab or job.model.vocab_size or job.data.vocab_size
    cfg = ModelConfig(vocab_size=vocab, d_model=d_model)
    rows: list[Row] = []
    for dtype in ("fp32", "bf16") if cpu_has_native_bf16() else ("fp32",):
        plain, chunked = (fresh_peak(work, v, tokens, d_model, vocab, dtype) for v in VARIANTS)
        per_token = activation_bytes_per_token(cfg, dtype)["loss"]
        planned = (tokens * per_token + loss_workspace_bytes(cfg, dtype)) / 2**20
        case = {"dtype": dtype, "tokens": tokens, "d_model": d_model, "vocab": vocab}
        rows += [
            row("peak, plain loss", plain, "MiB", **case),
            row("peak, chunked loss", chunked, "MiB", **case),
            row("plain / chunked peak", plain / max(chunked, 1e-9), "x", **case),
            row("plan estimate, chunked loss", planned, "MiB", **case),
            row("chunked peak / plan estimate", chunked / planned, "x", **case),
        ]
    return rows
