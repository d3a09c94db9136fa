"""The big model on one GPU at the paper's batch: tokens/s, MFU and peak memory of the training
step in bf16, ZeRO 1 and 2, with and without torch.compile, and with `train.deterministic`.

Each configuration runs in a process of its own (so that one engine's memory never counts in
the next one's peak), none started after `budget_s` (GPU_BENCH_BUDGET_S, else 400 s); one that
fails or is not reached leaves "configurations finished" below its goal. At smoke size the same
code runs on the CPU at the smoke model.

A configuration: the trainer's own pieces (build_engine, train_step, trainer.flops) on one
rank, fed random tokens, `tokens` per side per step. `fixed` lengths: every sentence `seq_len`
tokens, no padding. `wmt14` lengths: drawn like WMT14 En-De's in BPE tokens (log-normal, median
24, clipped at data.max_len; target = source x a log-normal ratio around 1.05) and cut by the
loader's own batcher, so that steps carry padding and change shape as in training. Tokens/s
counts real tokens only. Attention is SDPA restricted to its fused kernels (and math on a CPU).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.common import (
    CPU_ENV,
    SMOKE_MODEL,
    BenchInputError,
    Row,
    in_fresh_process,
    open_job,
    row,
)
from data_pipeline.batching import Batch, Sample, collate, plan_batches, round_up
from data_pipeline.tokenizer import EOS_ID
from model.config import ModelConfig
from trainer.config import compile_scope
from trainer.ds.engine import PRECISION_DTYPES, build_engine, make_deterministic, seed_everything
from trainer.flops import peak_flops
from trainer.metrics import host_rss_gb
from trainer.step import batch_flops, train_step

# WMT14 En-De sentence lengths in BPE tokens, as a log-normal: median and spread of the source
# side, and of the target / source length ratio.
WMT14_MEDIAN, WMT14_SIGMA = 24.0, 0.6
RATIO_MEDIAN, RATIO_SIGMA = 1.05, 0.2


def matmul_peak(dtype: torch.dtype, size: int = 8192, reps: int = 10) -> float:
    """Measured dense matmul FLOP/s on this GPU (the planner's --peak-tflops figure)."""
    a = torch.randn(size, size, device="cuda", dtype=dtype)
    b = torch.randn(size, size, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2.0 * size**3 * reps / (time.perf_counter() - start)


def padded_tokens(samples: list[Sample], group: list[int], pad_multiple: int = 1) -> int:
    """B * max(S, T) of the batch `group` of `samples`, as the batcher's budget counts it."""
    longest = max(max(samples[i].src_len, samples[i].tgt_len) for i in group)
    return len(group) * round_up(longest, pad_multiple)


def wmt14_steps(job: Any, vocab: int, tokens: int, n_steps: int, seed: int = 1) -> list[list]:
    """`n_steps` steps of `job.train.grad_accum` micro-batches of random ids at WMT14-like
    lengths, cut by the loader's batcher at `tokens // grad_accum` padded tokens per side."""
    d, k = job.data, job.train.grad_accum
    micro_tokens = max(d.max_len, tokens // k)
    rng = np.random.default_rng(seed)
    want = n_steps * k
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
    return [micro[i : i + k] for i in range(0, want, k)]


def fixed_step(job: Any, vocab: int, tokens: int, seq_len: int) -> list[Batch]:
    """One step of `job.train.grad_accum` unpadded micro-batches of `seq_len`-token rows."""
    k = job.train.grad_accum
    b = max(1, tokens // (seq_len * k))

    def micro() -> Batch:
        src = torch.randint(4, vocab, (b, seq_len))  # (B, S)
        tgt = torch.randint(4, vocab, (b, seq_len + 1))  # (B, T + 1)
        n = b * seq_len
        return Batch(src, tgt[:, :-1], tgt[:, 1:], n_src_tokens=n, n_tgt_tokens=n)

    return [micro() for _ in range(k)]


def time_steps(
    engine: Any, env: Any, cfg: ModelConfig, batches: list, warmup: int, steps: int, cuda: bool
) -> tuple[float, float, Any]:
    """`warmup` steps, then `steps` timed ones (step i on `batches[i % len(batches)]`), the peak
    memory counted from the warm-up's end: seconds per timed step, seconds of the first step
    (a compiled model's compilation included) and the last step's sums."""
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    if not cuda:
        backends.append(SDPBackend.MATH)
    sync = torch.cuda.synchronize if cuda else lambda: None

    def step(i: int) -> Any:
        return train_step(engine, batches[i % len(batches)], env, cfg.label_smoothing, [False]).sums

    with sdpa_kernel(backends):
        first = time.perf_counter()
        for i in range(warmup):
            step(i)
            if i == 0:
                sync()
                first = time.perf_counter() - first
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for i in range(warmup, warmup + steps):
            sums = step(i)
        sync()
        step_s = (time.perf_counter() - start) / steps
    return step_s, first, sums


class Size(NamedTuple):
    """The preset and device, `tokens` per side per step, `warmup` untimed and `steps` timed
    steps, the fixed lengths' `seq_len`."""

    config: str
    device: str
    tokens: int
    warmup: int
    steps: int
    seq_len: int = 32


FULL, SMOKE = (
    Size("configs/big.yaml", "cuda", 25000, 5, 20),
    Size("configs/tiny.yaml", "cpu", 256, 1, 2),
)


def configuration(fields: Sequence[Any], lengths: str, overrides: Sequence[str]) -> list[Row]:
    """One configuration's rows: the preset's engine with `overrides`, on `lengths`, at the
    `Size` of `fields` (a JSON list in its own process)."""
    size = Size(*fields)
    job, env, cfg = open_job(size.config, overrides, size.device, settle=False)
    if job.train.deterministic:
        make_deterministic()  # before the first matmul: cuBLAS reads its workspace setting then
    vocab, warmup, steps = cfg.vocab_size, size.warmup, size.steps
    seed_everything(1)
    engine = build_engine(job, cfg, env)
    if lengths == "fixed":
        batches = [fixed_step(job, vocab, size.tokens, size.seq_len)]
    else:
        batches = wmt14_steps(job, vocab, size.tokens, warmup + steps)
    cuda = size.device == "cuda"
    step_s, first_s, sums = time_steps(engine, env, cfg, batches, warmup, steps, cuda)
    from torch._dynamo.utils import counters  # imported by the engine's optimizer already

    graphs = int(counters["stats"]["unique_graphs"])  # dynamo's graphs: recompiles show here
    timed = [batches[i % len(batches)] for i in range(warmup, warmup + steps)]
    real = sum(b.n_src_tokens + b.n_tgt_tokens for step in timed for b in step)
    padded = sum(b.src.numel() + b.tgt_out.numel() for step in timed for b in step)
    per_step = real // steps  # real tokens of both sides
    flops = sum(batch_flops(cfg, step) for step in timed) / steps
    precision = job.train.precision
    dtype = PRECISION_DTYPES[precision]
    m = int(timed[0][0].tgt_out.numel())  # B * T rows of the projections' matrix products
    peak = peak_flops(env.device, dtype, cfg, m) or float("nan")
    # on a CPU the trainer's own peak is already a measured one, at the model's shapes
    measured_peak = matmul_peak(dtype) if cuda else peak
    memory = torch.cuda.max_memory_allocated() if cuda else host_rss_gb() * 1e9
    compiled = compile_scope(job.train.compile)
    compiled = "false" if compiled == "auto" else compiled  # build_engine compiles nothing then
    name = f"ZeRO {job.train.zero_stage}, compile {compiled}"
    name += "" if lengths == "fixed" else f", {lengths} lengths"
    name += ", deterministic" if job.train.deterministic else ""
    name += "" if job.train.overlap_comm else ", no overlap"
    case = {
        "zero": job.train.zero_stage,
        "compile": compiled,
        "lengths": lengths,
        "deterministic": job.train.deterministic,
        "overlap_comm": job.train.overlap_comm,
        "precision": precision,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "params": sum(p.numel() for p in engine.module.parameters()),
        "tokens_per_step": per_step,
    }
    figures = [
        ("tokens/s", per_step / step_s, "tokens/s"),
        ("step", step_s, "s"),
        ("first step, compilation included", first_s, "s"),
        ("graphs compiled", graphs, "graphs"),
        ("MFU (table peak)", flops / step_s / peak, "fraction"),
        ("MFU (measured matmul peak)", flops / step_s / measured_peak, "fraction"),
        ("peak memory", memory / 2**30, "GiB"),
        ("loss", float(sums[0] / sums[2]), "loss"),
        ("padding", 100 * (1.0 - real / padded), "%"),
    ]
    return [row(f"{name}: {figure}", value, unit, **case) for figure, value, unit in figures]


# (ZeRO stage, train.compile, lengths, train.deterministic, train.overlap_comm), the most
# telling first: eager, then the GPU's default (`auto`: each layer compiled) at WMT14-like
# lengths; at smoke size none compiled (on a CPU a compile is a minute;
# tests/integration/test_engine_options.py trains compiled) and all overlapped. The
# deterministic one prices `train.deterministic`, the last two overlap_comm, against the first.
CONFIGS = (
    (1, "false", "fixed", False, True), (1, "layers", "wmt14", False, True),
    (1, "false", "fixed", False, False), (1, "false", "wmt14", False, True),
    (1, "layers", "fixed", False, True), (1, "false", "fixed", True, True),
    (1, "model", "fixed", False, True), (2, "false", "fixed", False, True),
    (2, "model", "fixed", False, True), (2, "false", "fixed", False, False),
)  # fmt: skip
SMOKE_CONFIGS = tuple(c for c in CONFIGS if c[1] == "false" and c[4])


def measure(work: Path, smoke: bool = False, budget_s: float | None = None) -> list[Row]:
    """Every configuration in turn, each in its own process."""
    if smoke:
        size, extra = SMOKE, [*SMOKE_MODEL, "data.vocab_size=64"]
        limits, configs = (240, 300), SMOKE_CONFIGS
        env, budget_s = CPU_ENV, budget_s or 900
    else:
        if not torch.cuda.is_available():
            raise BenchInputError("gpu: torch sees no CUDA device (--smoke runs the CPU path)")
        size, extra, limits, configs = FULL, [], (90, 240), CONFIGS
        env, budget_s = {}, budget_s or float(os.environ.get("GPU_BENCH_BUDGET_S", 400))
    start, rows, done = time.monotonic(), list[Row](), 0
    for i, (zero, compile_, lengths, deterministic, overlap) in enumerate(configs):
        name = f"ZeRO {zero}, compile {compile_}, {lengths} lengths"
        name += ", deterministic" if deterministic else ""
        name += "" if overlap else ", no overlap"
        if time.monotonic() - start > budget_s:
            print(f"== {name}: not started ({time.monotonic() - start:.0f} s elapsed)", flush=True)
            continue
        over = [*extra, "train.grad_accum=1", "train.precision=bf16", f"train.zero_stage={zero}",
                f"train.compile={compile_}",
                f"train.deterministic={str(deterministic).lower()}",
                f"train.overlap_comm={str(overlap).lower()}"]  # fmt: skip
        kwargs = {"fields": size, "lengths": lengths, "overrides": over}
        try:
            found = in_fresh_process("gpu:configuration", kwargs, work / f"{i}.log", env,
                                     limits[compile_ != "false"])  # fmt: skip
        except SystemExit as exc:
            print(f"== {name}: failed\n{exc}", flush=True)
            continue
        print(f"== {name}: done", flush=True)
        rows, done = rows + found, done + 1
    return [*rows, row("configurations finished", done, "", goal=f">= {len(configs)}")]
