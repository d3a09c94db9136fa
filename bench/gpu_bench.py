"""One configuration of bench/gpu.sh: tokens/s, MFU and peak memory of the training step.

    python -m bench.gpu_bench --config configs/big.yaml --tokens 25000 --out ROWS.jsonl \\
        [--device cuda|cpu] [--steps 20] [--warmup 5] [--lengths fixed|wmt14] [key=value ...]

The trainer's own pieces (trainer.ds.engine.build_engine, train_step, trainer.flops) on one rank,
fed micro-batches of random tokens with --tokens per side per step. `--lengths fixed` (the
best case): every sentence --seq-len tokens, no padding, one batch shape. `--lengths wmt14`:
sentence lengths drawn like WMT14 En-De's in BPE tokens (log-normal, median 24 tokens, a long
tail clipped at data.max_len; the target's length is the source's times a log-normal ratio
around 1.05), cut into batches by the loader's own batcher (data_pipeline.batching at the
config's max_tokens, pad_multiple, batch_multiple and bucket_width, a shuffled window), so the
steps carry padding and change shape as in training. Tokens/s counts real tokens only; the
padding share is in the row. Attention runs through SDPA restricted to the
fused kernels (flash; memory-efficient where a boolean mask is passed, as for the decoder's
causal mask); on a CPU the math kernel is allowed too. `train.compile=true` as an override
compiles the model. Appends one JSON row to --out; `--table ROWS.jsonl` prints the table, and
with `--json PATH` also writes its figures as rows for bench/suite.py.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, NamedTuple


def matmul_peak(device: str, dtype_name: str = "bf16", size: int = 8192, reps: int = 10) -> float:
    """Measured dense matmul FLOP/s on this GPU (the planner's --peak-tflops figure)."""
    import torch

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2.0 * size**3 * reps / (time.perf_counter() - start)


# WMT14 En-De sentence lengths in BPE tokens, as a log-normal: median and spread of the source
# side, and of the target / source length ratio.
WMT14_MEDIAN, WMT14_SIGMA = 24.0, 0.6
RATIO_MEDIAN, RATIO_SIGMA = 1.05, 0.2


def padded_tokens(samples: list, group: list[int], pad_multiple: int = 1) -> int:
    """B * max(S, T) of the batch `group` of `samples`, as the batcher's budget counts it."""
    from data_pipeline.batching import round_up

    longest = max(max(samples[i].src_len, samples[i].tgt_len) for i in group)
    return len(group) * round_up(longest, pad_multiple)


def wmt14_steps(job: Any, vocab: int, tokens: int, n_steps: int, seed: int = 1) -> list[list]:
    """`n_steps` steps of `job.train.grad_accum` micro-batches each, of random ids at lengths
    drawn like WMT14's, cut by the loader's batcher with at most `tokens // grad_accum` padded
    tokens per side per micro-batch."""
    import numpy as np

    from data_pipeline.batching import Sample, collate, plan_batches
    from data_pipeline.tokenizer import EOS_ID

    d = job.data
    micro_tokens = max(d.max_len, tokens // job.train.grad_accum)
    rng = np.random.default_rng(seed)
    want = n_steps * job.train.grad_accum
    samples: list[Sample] = []
    groups: list[list[int]] = []
    n = int(1.2 * (want + 2) * micro_tokens / WMT14_MEDIAN)  # pairs in the window
    while len(groups) < want:
        src_len = np.clip(np.rint(rng.lognormal(np.log(WMT14_MEDIAN), WMT14_SIGMA, n)), 1, None)
        ratio = rng.lognormal(np.log(RATIO_MEDIAN), RATIO_SIGMA, n)
        tgt_len = np.clip(np.rint(src_len * ratio), 1, None)
        keep = np.maximum(src_len + 1, tgt_len + 1) <= d.max_len  # EOS / BOS added
        samples = [
            Sample(
                f"s{i}",
                np.append(rng.integers(4, vocab, int(s)), EOS_ID),  # (S,) ids + EOS
                rng.integers(4, vocab, int(t)),  # (T - 1,)
                "",
                "",
            )
            for i, (s, t) in enumerate(zip(src_len[keep], tgt_len[keep], strict=True))
        ]
        groups = plan_batches(
            samples,
            max_tokens=micro_tokens,
            pad_multiple=d.pad_multiple,
            bucket_width=d.bucket_width,
            rng=rng,
            batch_multiple=d.batch_multiple,
        )
        # the few part-filled batches at the window's end are left out
        groups = [
            g for g in groups if padded_tokens(samples, g, d.pad_multiple) >= 0.5 * micro_tokens
        ]
        n *= 2  # too few full batches: a larger window
    micro = [collate([samples[i] for i in g], d.pad_multiple) for g in groups[:want]]
    k = job.train.grad_accum
    return [micro[i : i + k] for i in range(0, want, k)]


class Timing(NamedTuple):
    """What the timed steps of one configuration gave."""

    loss: float  # of the last step
    warmup_s: float  # all --warmup steps
    step_s: float  # per timed step


def run(args: argparse.Namespace) -> dict:
    """One configuration: the engine of --config on --device, trained on random tokens for
    --warmup and then --steps timed steps; its row of the table."""
    from launch.config import load_config
    from model.config import ModelConfig
    from trainer.dist import init_distributed
    from trainer.ds.engine import build_engine, seed_everything

    job = load_config(args.config, [f"train.device={args.device}", *args.overrides])
    env = init_distributed(args.device)
    vocab = job.model.vocab_size or job.data.vocab_size
    cfg = ModelConfig(**{**job.model.__dict__, "vocab_size": vocab})
    seed_everything(1)
    engine = build_engine(job, cfg, env)
    steps = step_batches(args, job, vocab)
    timing = time_steps(args, engine, env, cfg, steps)
    return result_row(args, job, env, cfg, engine, steps, timing)


def step_batches(args: argparse.Namespace, job: Any, vocab: int) -> list[list]:
    """The steps to train on, `job.train.grad_accum` micro-batches each: one step of
    --seq-len-token rows, unpadded (`--lengths fixed`), or WMT14-like ones (`wmt14`)."""
    import torch

    from data_pipeline.batching import Batch

    rows_per_micro = max(1, args.tokens // (args.seq_len * job.train.grad_accum))

    def micro() -> Batch:
        src = torch.randint(4, vocab, (rows_per_micro, args.seq_len))  # (B, S)
        tgt = torch.randint(4, vocab, (rows_per_micro, args.seq_len + 1))  # (B, T + 1)
        n = rows_per_micro * args.seq_len
        return Batch(src, tgt[:, :-1], tgt[:, 1:], n_src_tokens=n, n_tgt_tokens=n)

    if args.lengths == "fixed":
        return [[micro() for _ in range(job.train.grad_accum)]]
    return wmt14_steps(job, vocab, args.tokens, args.warmup + args.steps)


def time_steps(args: argparse.Namespace, engine: Any, env: Any, cfg: Any, steps: list) -> Timing:
    """--warmup steps, then --steps timed ones (step i trains on `steps[i % len(steps)]`), with
    attention restricted to the fused SDPA kernels (and the math one on a CPU); the peak memory
    statistics restart after the warm-up."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from trainer.step import train_step

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    if args.device == "cpu":
        backends.append(SDPBackend.MATH)
    cuda = args.device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def batches(i: int) -> list:
        return steps[i % len(steps)]

    with sdpa_kernel(backends):
        start = time.perf_counter()
        for i in range(args.warmup):
            sums = train_step(engine, batches(i), env, cfg.label_smoothing, [False]).sums
        sync()
        warmup_s = time.perf_counter() - start
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for i in range(args.warmup, args.warmup + args.steps):
            sums = train_step(engine, batches(i), env, cfg.label_smoothing, [False]).sums
        sync()
        seconds = (time.perf_counter() - start) / args.steps
    return Timing(float(sums[0] / sums[2]), warmup_s, seconds)


def result_row(
    args: argparse.Namespace, job: Any, env: Any, cfg: Any, engine: Any, steps: list,
    timing: Timing,
) -> dict:  # fmt: skip
    """The row of one configuration: tokens/s (real tokens), padding, FLOP/s and MFU against
    the trainer's peak and a measured matmul peak, peak memory and the loss."""
    import torch

    from trainer.ds.engine import PRECISION_DTYPES
    from trainer.flops import peak_flops
    from trainer.step import batch_flops

    cuda = args.device == "cuda"
    seconds = timing.step_s
    measured = [steps[i % len(steps)] for i in range(args.warmup, args.warmup + args.steps)]
    real = sum(b.n_src_tokens + b.n_tgt_tokens for step in measured for b in step)
    padded = sum(b.src.numel() + b.tgt_out.numel() for step in measured for b in step)
    tokens = real // args.steps  # real tokens of both sides, per step
    flops = sum(batch_flops(cfg, step) for step in measured) / args.steps
    micro = measured[0][0]
    dtype = PRECISION_DTYPES[job.train.precision]
    rows = int(micro.tgt_out.numel())  # (B * T) rows of the projections' matrix products
    peak = peak_flops(env.device, dtype, cfg, rows) or float("nan")
    # on a CPU the trainer's own peak is already a measured one, at the model's shapes
    measured_peak = matmul_peak(args.device, job.train.precision) if cuda else peak
    if cuda:
        mem = torch.cuda.max_memory_allocated() / 2**30
    else:
        from trainer.metrics import host_rss_gb

        mem = host_rss_gb() * 1e9 / 2**30
    return {
        "zero": job.train.zero_stage,
        "compile": bool(getattr(job.train, "compile", False)),
        "lengths": args.lengths,
        "padding": 1.0 - real / padded,
        "precision": job.train.precision,
        "params": sum(p.numel() for p in engine.module.parameters()),
        "tokens_per_step": tokens,
        "step_s": seconds,
        "warmup_s": timing.warmup_s,
        "tokens_per_s": tokens / seconds,
        "tflops": flops / seconds / 1e12,
        "mfu": flops / seconds / peak,
        "mfu_measured_peak": flops / seconds / measured_peak,
        "peak_tflops": peak / 1e12,
        "measured_peak_tflops": measured_peak / 1e12,
        "peak_mem_gib": mem,
        "loss": timing.loss,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }


def format_table(rows: list[dict]) -> str:
    head = rows[0] if rows else {}
    lines = [
        f"device {head.get('device', '?')}, {head.get('params', 0):,} parameters, "
        f"{head.get('tokens_per_step', 0):,} tokens per step (both sides), "
        f"table peak {head.get('peak_tflops', 0):.4g} TFLOP/s, "
        f"measured matmul {head.get('measured_peak_tflops', 0):.4g} TFLOP/s",
        "zero  compile  lengths  padding  step s   tokens/s   TFLOP/s   MFU    MFU(meas.)  "
        "peak GiB  warm-up s  loss",
    ]
    for r in rows:
        lines.append(
            f"{r['zero']:>4}  {'yes' if r['compile'] else 'no':>7}  {r['lengths']:>7}  "
            f"{100 * r['padding']:6.1f}%  {r['step_s']:6.3f}  "
            f"{r['tokens_per_s']:9.0f}  {r['tflops']:8.1f}  {r['mfu']:5.3f}  "
            f"{r['mfu_measured_peak']:10.3f}  {r['peak_mem_gib']:8.2f}  {r['warmup_s']:9.1f}  "
            f"{r['loss']:.3f}"
        )
    return "\n".join(lines)


def result_rows(rows: list[dict]) -> list[dict]:
    """The table's figures as the suite's rows, one set per configuration (ZeRO, compile)."""
    out = []
    for r in rows:
        name = f"ZeRO {r['zero']}, compile {'yes' if r['compile'] else 'no'}"
        if r["lengths"] != "fixed":
            name += f", {r['lengths']} lengths"
        case = {
            "zero": r["zero"],
            "compile": r["compile"],
            "lengths": r["lengths"],
            "precision": r["precision"],
            "device": r["device"],
            "params": r["params"],
            "tokens_per_step": r["tokens_per_step"],
        }
        out += [
            {"figure": f"{name}: tokens/s", "value": r["tokens_per_s"], "unit": "tokens/s", **case},
            {"figure": f"{name}: step", "value": r["step_s"], "unit": "s", **case},
            {"figure": f"{name}: MFU (table peak)", "value": r["mfu"], "unit": "fraction", **case},
            {"figure": f"{name}: MFU (measured matmul peak)", "value": r["mfu_measured_peak"],
             "unit": "fraction", **case},
            {"figure": f"{name}: peak memory", "value": r["peak_mem_gib"], "unit": "GiB", **case},
            {"figure": f"{name}: loss", "value": r["loss"], "unit": "loss", **case},
            {"figure": f"{name}: padding", "value": 100 * r["padding"], "unit": "%", **case},
        ]  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/big.yaml")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tokens", type=int, default=25000, help="tokens per side per step")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--lengths",
        default="fixed",
        choices=["fixed", "wmt14"],
        help="fixed: --seq-len tokens, no padding; wmt14: WMT14-like lengths through the batcher",
    )
    parser.add_argument("--out", help="append the row to this JSONL file")
    parser.add_argument("--table", help="print the table of this JSONL file and exit")
    parser.add_argument("--json", metavar="PATH", help="with --table: write the rows to PATH")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.table:
        rows = [json.loads(x) for x in Path(args.table).read_text().splitlines() if x.strip()]
        print(format_table(rows))
        if args.json:
            from bench.common import write_rows

            write_rows(args.json, result_rows(rows))
        return
    row = run(args)
    print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
