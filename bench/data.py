"""Data pipeline at scale, side by side in one run on one corpus.

1. Shards: the corpus prepared (2 workers) into ``.tar`` and ``.tar.gz``: bytes per sample,
   pairs/s of the shard stage.
2. Loader: real tokens/s (source + target) of one ``TokenBatchStream``, 0 and 1 workers, both
   shard kinds, reading the tars and reading the packed ids (``data.store``), over `seconds`
   from the first batch on (several shuffle windows at full size); the start-up seconds beside.
3. Input order: the corpus prepared in input order against globally shuffled, read at the
   demo's data settings and at the defaults: tokens/s and padding (an in-order window holds
   sentences of one source, of similar lengths).
4. Padding of the training split at ``max_tokens``: batching v1 (random order inside buckets
   of max(S, T)) and v2 (sorted by padded shape) at the old defaults against v3 (v2 + batches
   cut to a multiple of ``batch_multiple`` rows) at the defaults and nearby. Padding splits
   into rounding (what each row pays alone at the pad multiple) and mismatch (rows padded up
   to a longer row of their batch). Fill: real tokens per batch / (2 * max_tokens); aligned:
   batches whose B * S and B * T are multiples of 8.
5. Prepare at scale of ``pairs`` pairs (the training pairs repeated, words rotated): pairs/s of
   the shard stage, peak RSS of the main process and its largest child, and the peak summed
   PSS of the process tree in the sentencepiece stage (it grows with the corpus up to
   ``input_sentence_size`` sentences) and in the shard stage (it should not grow).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import psutil

from bench.common import ROOT, Row, row
from data_pipeline.batching import Sample, plan_batches, round_up
from data_pipeline.config import DataConfig
from data_pipeline.corpus.synthetic import write_synthetic
from data_pipeline.loader import TokenBatchStream
from data_pipeline.manifest import read_manifest
from data_pipeline.shards import iter_shard

MAX_LEN = 256
STORES = ("tar", "packed")  # data.store: what the training stream reads


class Batching(NamedTuple):
    """One way of cutting windows into batches, as the loader's batcher of `version` did."""

    version: int
    pad_multiple: int
    batch_multiple: int
    bucket_width: int
    window: int

    def __str__(self) -> str:
        multiples = f"pad {self.pad_multiple}, batch multiple {self.batch_multiple}"
        return f"v{self.version}, {multiples}, bucket {self.bucket_width}, window {self.window}"


# the settings before batching v3 (v1 and v2 at pad 8, bucket 8, window 2,000), then v3 at the
# defaults and around
PADDING_ROWS = [
    Batching(1, 8, 1, 8, 2000),
    Batching(2, 8, 1, 8, 2000),
    Batching(3, 8, 8, 1, 100_000),
    Batching(3, 1, 1, 1, 16_000),
    Batching(3, 1, 8, 1, 2_000),
    Batching(3, 1, 8, 1, 16_000),
    Batching(3, 1, 8, 1, 100_000),
]
ORDER_SETTINGS = {"demo (tiny.yaml)": (1536, 4000), "defaults": (4096, 100_000)}  # (tokens, window)


def measure(
    work: Path,
    corpus: str | None = None,
    smoke: bool = False,
    vocab_size: int = 8000,
    max_tokens: int = 4096,
    seconds: float = 30.0,
    pairs: Sequence[int] = (250_000, 1_000_000),
    spm_sentences: int = 2_000_000,
    loader_epochs: int | None = None,
) -> list[Row]:
    """Sections 1-5 on `corpus` (None: 2,000 synthetic pairs); `seconds` per loader run of
    section 2 over `loader_epochs` (None: as many as fit, so that many windows are read, not
    only the first one handed out), `spm_sentences` prepare's input_sentence_size at scale."""
    if smoke:
        vocab_size, seconds, pairs, spm_sentences, loader_epochs = 200, 0.5, [3000], 5000, 1
    src = Path(ROOT, corpus) if corpus else work / "corpus-smoke"
    if not corpus:
        write_synthetic(src, n_train=2000, n_valid=50, n_test=50, seed=1)
    rows: list[Row] = []
    data = {kind: work / f"data-{kind}" for kind in ("tar", "tar.gz")}
    for kind, out in data.items():  # 1. shards
        r = run_prepare(src, out, vocab_size=vocab_size, compress_shards=kind == "tar.gz")
        rows.append(row(f"shard bytes per sample, {kind}", r["bytes_per_sample"], "bytes",
                        shards=kind))  # fmt: skip
        rows.append(row(f"prepare shard stage, {kind}", r["pairs_s"], "pairs/s", shards=kind,
                        workers=2))  # fmt: skip
    for kind, store, workers in ((k, s, w) for k in data for s in STORES for w in (0, 1)):  # 2.
        tokens_s, startup_s, _ = loader_rate(data[kind], workers, max_tokens, seconds,
                                             loader_epochs, store=store)  # fmt: skip
        rows.append(row(f"loader, {kind}, {store} store, {workers} workers", tokens_s, "tokens/s",
                        startup_s=startup_s, shards=kind, store=store, workers=workers,
                        max_tokens=max_tokens, seconds=seconds))  # fmt: skip
    rows += by_input_order(src, work, data["tar"], vocab_size, seconds, smoke)  # 3.
    lens = read_lengths(data["tar"])  # 4. padding
    for batching in PADDING_ROWS:
        r = padding_stats(lens, batching, max_tokens)
        rows.append(row(f"padding, {batching}", 100 * r["padding"], "%",
                        rounding_pct=100 * r["rounding"], mismatch_pct=100 * r["mismatch"],
                        fill_pct=100 * r["fill"], aligned_pct=100 * r["rows_multiple"],
                        batches=r["batches"], max_tokens=max_tokens))  # fmt: skip
    for n in pairs:  # 5. prepare at scale
        out = work / f"data-{n}"
        kw = {"vocab_size": vocab_size, "input_sentence_size": spm_sentences}
        r = run_prepare(scaled_corpus(src, work / f"corpus-{n}", n), out, **kw)
        shutil.rmtree(out, ignore_errors=True)
        case = {"pairs": n, "workers": 2, "spm_sentences": spm_sentences}
        rows += [
            row(f"prepare {n} pairs, shard stage", r["pairs_s"], "pairs/s", wall_s=r["wall_s"],
                spm_s=r["spm_s"], **case),
            row(f"prepare {n} pairs, peak RSS main", r["main_mb"], "MB", **case),
            row(f"prepare {n} pairs, peak RSS largest child", r["child_mb"], "MB", **case),
            row(f"prepare {n} pairs, tree PSS sentencepiece stage", r["spm_pss_mb"], "MB",
                **case),
            row(f"prepare {n} pairs, tree PSS shard stage", r["shard_pss_mb"], "MB", **case),
        ]  # fmt: skip
    return [{**r, "corpus": str(corpus or src)} for r in rows]


def loader_rate(
    data: Path,
    workers: int,
    max_tokens: int,
    seconds: float,
    epochs: int | None = 1,
    **batching: Any,
) -> tuple[float, float, float]:
    """One TokenBatchStream over train (`epochs` of it, None: endless; at most `seconds` after
    its first batch): real tokens/s from the first batch on, the seconds to it, and the padding
    fraction."""
    cfg = DataConfig(
        dir=str(data), max_tokens=max_tokens, max_len=MAX_LEN, num_workers=workers, **batching
    )
    start = time.perf_counter()
    first = None
    tokens = padded = 0
    for b in TokenBatchStream(data, "train", cfg, epochs=epochs):
        if first is None:
            first = time.perf_counter()
            continue
        tokens += b.n_src_tokens + b.n_tgt_tokens
        padded += b.src.numel() + b.tgt_out.numel()
        if time.perf_counter() - first > seconds:
            break
    first = first or start
    return tokens / (time.perf_counter() - first), first - start, 1 - tokens / max(1, padded)


def by_input_order(
    corpus: Path, work: Path, shuffled: Path, vocab_size: int, seconds: float, smoke: bool
) -> list[Row]:
    """Section 3: the corpus prepared in input order against `shuffled`, one stream each."""
    in_order = work / "data-tar-in-order"
    run_prepare(corpus, in_order, vocab_size=vocab_size, shuffle=False)
    rows: list[Row] = []
    for name, (max_tokens, window) in ORDER_SETTINGS.items():
        if smoke:
            max_tokens, window = min(max_tokens, 512), min(window, 500)
        for order, data in (("in order", in_order), ("shuffled", shuffled)):
            tokens_s, _, pad = loader_rate(data, 1, max_tokens, seconds, shuffle_buffer=window)
            rows.append(row(f"loader by input order, {name}, {order}", tokens_s, "tokens/s",
                            padding_pct=100 * pad, max_tokens=max_tokens, window=window,
                            order=order))  # fmt: skip
    return rows


def read_lengths(data: Path, max_len: int = MAX_LEN) -> list[list[tuple[int, int]]]:
    """(S, T) of every training sample the loader keeps, per shard, in file order."""
    m = read_manifest(data)
    item = 2 if m["dtype"] == "uint16" else 4
    out = []
    for shard in m["splits"]["train"]["shards"]:
        lens = []
        for raw in iter_shard(data / shard["name"]):
            s, t = len(raw.parts["src.ids"]) // item, len(raw.parts["tgt.ids"]) // item + 1
            if max(s, t) <= max_len:
                lens.append((s, t))
        out.append(lens)
    return out


def plan_v1(
    samples: Sequence[Sample], max_tokens: int, pad_multiple: int, bucket_width: int, rng: Any
) -> list[list[int]]:
    """Batching v1: random order inside buckets of max(S, T), cut at `max_tokens`."""
    order = sorted(
        rng.permutation(len(samples)).tolist(),
        key=lambda i: (max(samples[i].src_len, samples[i].tgt_len) - 1) // bucket_width,
    )
    batches: list[list[int]] = [[]]
    cur_s = cur_t = 0
    for i in order:
        s = round_up(max(cur_s, samples[i].src_len), pad_multiple)
        t = round_up(max(cur_t, samples[i].tgt_len), pad_multiple)
        if batches[-1] and (len(batches[-1]) + 1) * max(s, t) > max_tokens:
            batches.append([])
            cur_s = cur_t = 0
        batches[-1].append(i)
        cur_s, cur_t = max(cur_s, samples[i].src_len), max(cur_t, samples[i].tgt_len)
    return [b for b in batches if b]


def padding_stats(
    shards: list[list[tuple[int, int]]], b: Batching, max_tokens: int, seed: int = 1
) -> dict[str, float]:
    """Padding of one epoch batched as `b` says (windows of `b.window` samples per shard)."""
    real = padded = rounding = n_batches = aligned = 0
    pm = b.pad_multiple
    for k, lens in enumerate(shards):
        for ws in range(0, len(lens), b.window):
            chunk = np.array(lens[ws : ws + b.window]).reshape(-1, 2)  # (samples, S and T)
            samples = [Sample("", np.zeros(s, np.int64), np.zeros(t - 1), "", "") for s, t in chunk]
            rng = np.random.default_rng([seed, 0, k, 0, 1, ws])
            if b.version == 1:
                groups = plan_v1(samples, max_tokens, pm, b.bucket_width, rng)
            else:
                groups = plan_batches(samples, max_tokens=max_tokens, pad_multiple=pm,
                                      bucket_width=b.bucket_width, rng=rng,
                                      batch_multiple=b.batch_multiple)  # fmt: skip
            for g in groups:
                lengths = chunk[g]  # (rows, S and T)
                shape = -(-lengths.max(axis=0) // pm) * pm  # padded S, T
                real += int(lengths.sum())
                padded += len(g) * int(shape.sum())
                rounding += int((-(-lengths // pm) * pm - lengths).sum())
                n_batches += 1
                aligned += bool(np.all(len(g) * shape % 8 == 0))
    return {
        "padding": (padded - real) / padded,
        "rounding": rounding / padded,
        "mismatch": (padded - real - rounding) / padded,
        "fill": real / (n_batches * 2 * max_tokens),
        "batches": n_batches,
        "rows_multiple": aligned / max(1, n_batches),  # batches whose B*S and B*T % 8 == 0
    }


_PREPARE = r"""
import json, resource, sys, time
from pathlib import Path
from data_pipeline.prepare import prepare
args, marks, t0 = json.loads(sys.argv[1]), [], time.monotonic()
m = prepare(Path(args["corpus"]), Path(args["out"]), progress=False,
            log=lambda msg: marks.append([time.monotonic(), msg]), **args["kw"])
print(json.dumps({"t0": t0, "wall": time.monotonic() - t0, "marks": marks, "manifest": m,
                  "main_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "child_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def tree_pss(pid: int) -> int:
    """The summed PSS (bytes) of a process and its descendants (shared pages count once)."""
    total = 0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += p.memory_full_info().pss
    return total


def run_prepare(corpus: Path, out: Path, **kw: Any) -> dict[str, float]:
    """``prepare`` (2 workers) in a fresh subprocess, its tree's PSS sampled every 50 ms:
    seconds, pairs/s of the shard stage, shard bytes per sample and peak memory in MB."""
    print(f"prepare {corpus} -> {out}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    args = json.dumps({"corpus": str(corpus), "out": str(out), "kw": {"workers": 2, **kw}})
    timeline: list[tuple[float, int]] = []  # (monotonic time, the tree's PSS)
    with tempfile.TemporaryFile() as result:
        proc = subprocess.Popen(
            [sys.executable, "-c", _PREPARE, args],
            cwd=ROOT,
            stdout=result,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        while proc.poll() is None:
            timeline.append((time.monotonic(), tree_pss(proc.pid)))
            time.sleep(0.05)
        if proc.returncode != 0:
            raise RuntimeError(f"prepare of {corpus} failed with exit code {proc.returncode}")
        result.seek(0)
        r = json.loads(result.read().decode().splitlines()[-1])  # marks on this process's clock
    spm_done = next(t for t, m in r["marks"] if "sentencepiece trained" in m)
    train_done = next(t for t, m in r["marks"] if m.startswith("prepare: train:"))
    train = r["manifest"]["splits"]["train"]
    return {
        "wall_s": r["wall"],
        "spm_s": spm_done - r["t0"],
        "pairs_s": train["cleaning"]["lines"] / (train_done - spm_done),
        "bytes_per_sample": sum(s["bytes"] for s in train["shards"]) / max(1, train["samples"]),
        "main_mb": r["main_kb"] / 1024,
        "child_mb": r["child_kb"] / 1024,
        "spm_pss_mb": max((m for t, m in timeline if t <= spm_done), default=0) / 2**20,
        "shard_pss_mb": max((m for t, m in timeline if t > spm_done), default=0) / 2**20,
    }


def scaled_corpus(real: Path, out: Path, pairs: int) -> Path:
    """`pairs` training pairs from `real`'s (repetition r rotates each line's words by r)."""
    done = out / "n"
    if done.is_file() and done.read_text() == str(pairs):
        return out
    out.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        lines = (real / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        with open(out / f"train.{lang}", "w", encoding="utf-8") as f:
            for n in range(pairs):
                r, i = divmod(n, len(lines))
                words = lines[i].split()
                k = r % len(words) if words else 0
                f.write((" ".join(words[k:] + words[:k]) if r else lines[i]) + "\n")
        for split in ("valid", "test"):
            if (real / f"{split}.{lang}").is_file():
                shutil.copyfile(real / f"{split}.{lang}", out / f"{split}.{lang}")
    done.write_text(str(pairs))
    return out
