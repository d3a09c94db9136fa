"""Peak memory of the output projection and label-smoothed loss, forward and backward: the
plain loss over materialised (B, T, V) logits against the chunked one (model/loss.py).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.loss_memory [--config configs/base.yaml] \\
        [--tokens 4096] [--smoke] [--json PATH]

The preset gives d_model and the vocabulary (base: 512 and 37,000); --tokens is the number of
target positions B*T of one micro-batch (4,096: base's `data.max_tokens` per rank). Each case
runs in a fresh Python process: decoder states (N, D) and the shared embedding (V, D) are
allocated first, then the process's resident set is read, then one forward and backward
(fp32, and bf16 where the CPU runs it natively); the figure is the peak resident set above
that baseline (getrusage's maxrss, with glibc's malloc returning freed blocks at once: see
RETURN_FREED_MEMORY), so it counts every buffer the loss and its gradients hold at once,
logits and their fp32 copy included. The same losses and gradients are
checked by tests/model/test_loss.py; this bench measures only memory, and sets the chunked
loss's peak beside what `paperscale plan` counts for it (launch/cost_model/activations.py).

`--smoke`: d_model 32, vocabulary 8,000, 4,096 tokens (seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT, add_output_arguments, row, write_rows

VARIANTS = ("plain", "chunked")
# glibc's malloc keeps a freed block below its (dynamic, up to 32 MiB) mmap threshold in the
# heap, where the resident set goes on counting it as if it were live; a fixed 1 MiB threshold
# maps every tensor of note on its own and returns it when freed, so the peak is the live peak.
RETURN_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}


def resident_bytes() -> int:
    """The resident set of this process now (/proc/self/statm, pages)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def measure(variant: str, tokens: int, d_model: int, vocab: int, dtype: str) -> dict[str, float]:
    """Run in the child: one forward + backward of `variant`; peak bytes above the baseline."""
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
    base = resident_bytes()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if variant == "plain":
        loss, _, n = label_smoothed_loss(F.linear(h, weight), target, 0.1)
    else:
        loss, _, n = chunked_label_smoothed_loss(h, weight, target, 0.1)
    (loss / n).backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if peak <= before:  # the loss never rose above start-up's own peak: not measurable
        raise SystemExit(f"{variant}: peak below start-up's ({before / 2**20:.0f} MiB)")
    return {"peak_mib": (peak - base) / 2**20, "loss": float(loss / n)}


def child_run(variant: str, tokens: int, d_model: int, vocab: int, dtype: str) -> dict:
    code = (
        "import json, sys; from bench.loss_memory import measure; "
        f"print(json.dumps(measure({variant!r}, {tokens}, {d_model}, {vocab}, {dtype!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **RETURN_FREED_MEMORY},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit(f"{variant} {dtype}: exit {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def plan_chunked_mib(tokens: int, d_model: int, vocab: int, dtype: str) -> float:
    """What `paperscale plan` counts for the chunked loss of `tokens` target positions: its
    per-token term (the decoder states' gradient) and its work space."""
    from launch.cost_model.activations import activation_bytes_per_token, loss_workspace_bytes
    from model.config import ModelConfig

    cfg = ModelConfig(vocab_size=vocab, d_model=d_model)
    per_token = activation_bytes_per_token(cfg, dtype)["loss"]
    return (tokens * per_token + loss_workspace_bytes(cfg, dtype)) / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/base.yaml")
    p.add_argument("--tokens", type=int, default=4096, help="target positions B*T")
    add_output_arguments(p, "d_model 32, vocabulary 8,000, 4,096 tokens")
    args = p.parse_args(argv)
    from launch.config import load_config
    from trainer.precision import cpu_has_native_bf16

    job = load_config(args.config, [])
    d_model, tokens = job.model.d_model, args.tokens
    vocab = job.model.vocab_size or job.data.vocab_size
    if args.smoke:
        d_model, vocab, tokens = 32, 8000, 4096
    dtypes = ["fp32", "bf16"] if cpu_has_native_bf16() else ["fp32"]
    logits_mib = tokens * vocab * 4 / 2**20
    print(f"{args.config}: d_model {d_model}, vocabulary {vocab:,}, {tokens:,} target positions "
          f"(fp32 logits alone: {logits_mib:,.0f} MiB)")  # fmt: skip
    rows = []
    for dtype in dtypes:
        got = {v: child_run(v, tokens, d_model, vocab, dtype) for v in VARIANTS}
        plain, chunked = got["plain"]["peak_mib"], got["chunked"]["peak_mib"]
        print(f"  {dtype}: plain {plain:,.0f} MiB, chunked {chunked:,.0f} MiB "
              f"(x{plain / max(chunked, 1e-9):.1f} less); loss {got['plain']['loss']:.6f} / "
              f"{got['chunked']['loss']:.6f}")  # fmt: skip
        planned = plan_chunked_mib(tokens, d_model, vocab, dtype)
        print(f"  {dtype}: `paperscale plan` counts {planned:,.0f} MiB for the chunked loss "
              f"(measured / plan {chunked / planned:.3f})")  # fmt: skip
        case = {"dtype": dtype, "tokens": tokens, "d_model": d_model, "vocab": vocab}
        rows += [
            row("peak, plain loss", plain, "MiB", **case),
            row("peak, chunked loss", chunked, "MiB", **case),
            row("plain / chunked peak", plain / max(chunked, 1e-9), "x", **case),
            row("plan estimate, chunked loss", planned, "MiB", **case),
            row("chunked peak / plan estimate", chunked / planned, "x", **case),
        ]
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
