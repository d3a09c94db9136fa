"""Data pipeline at scale: loader tokens/s, padding at a 4,096-token budget, prepare pairs/s and
peak memory, shard bytes per sample -- measured side by side in one run on a real corpus.

    python -m bench.data --corpus /tmp/corpus-real --work /tmp/bench-data --pairs 250000 1000000

1. ``prepare`` the corpus twice (plain ``.tar`` shards and ``.tar.gz``): bytes per sample.
2. Loader: tokens/s (source + target, real tokens of the delivered batches) of one
   ``TokenBatchStream`` with ``num_workers`` 0 and 1, on both shard kinds; steady rate
   measured from the first batch on (worker start-up is reported apart).
3. Padding of the training split at ``--max-tokens`` (4,096), with the loader's windows:
   batching v1 (random order inside ``bucket_width`` buckets of max(S, T)) and v2 (sorted by
   padded shape) at the old defaults (``pad_multiple`` 8, bucket 8, window 2,000) against v3
   (v2 + batches cut to a multiple of ``batch_multiple`` rows) at the defaults (pad 1, batch
   multiple 8, bucket 1, window 100,000) and nearby settings.  Padding
   (pad tokens / padded tokens, both sides) is split into *rounding*: what every row pays on
   its own at that multiple (``round_up(len, m) - len``; zero at 1, the same for any
   batching), and *mismatch*: the rest, rows padded up to a longer row of their batch.
   ``fill``: real tokens per batch / (2 * max_tokens); ``rows``: batches whose ``B * S`` and
   ``B * T`` (the row counts of the projections' matrix products) are multiples of 8.
4. Input order: the corpus prepared in its input order (``--no-shuffle``) and globally
   shuffled (the default), read at the demo's data settings (configs/tiny.yaml: 1,536-token
   micro-batches, 4,000-sample windows) and at the defaults: loader tokens/s and padding side
   by side. Real corpora arrive grouped by source, so an in-order window holds sentences of one
   kind (similar lengths: less padding) that a shuffled window mixes.
5. ``prepare`` with 2 workers on corpora of ``--pairs`` pairs (the real training pairs repeated,
   each repetition with its words rotated, so nothing is an exact duplicate) in a subprocess:
   pairs/s of the shard stage; peak RSS of the main process and of the largest child (the
   sentencepiece trainer or an encoder; ``ru_maxrss`` of ``RUSAGE_SELF``/``RUSAGE_CHILDREN``);
   and the peak of the summed PSS of the whole process tree (sampled every 50 ms; PSS counts
   pages shared after fork once) during the sentencepiece stage and during the shard stage.
   The sentencepiece stage grows with the corpus until ``input_sentence_size`` sentences (2M
   by default, i.e. 1M pairs) and stays there; the shard stage should not grow at all.

``--smoke``: without ``--corpus``, a synthetic corpus of 2,000 pairs written under ``--work``;
vocabulary 200, 0.5 s per loader measurement, one ``--pairs`` run of 3,000 (seconds).
``--json PATH`` writes the figures of every table as rows for bench/suite.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Row, add_output_arguments, row, write_rows
from bench.data_corpus import log, make_corpus, run_prepare, smoke_corpus
from bench.data_padding import PADDING_ROWS, padding_stats, read_lengths
from data_pipeline.config import DataConfig
from data_pipeline.loader import TokenBatchStream

# --------------------------------------------------------------------------------------------
# loader throughput


def loader_rate(
    data: Path, workers: int, max_tokens: int, seconds: float, **batching: Any
) -> dict[str, float]:
    """Real tokens/s one TokenBatchStream delivers (one epoch of train, or ``seconds`` after the
    first batch), with the default batching settings unless ``batching`` overrides them."""
    cfg = DataConfig(
        dir=str(data), max_tokens=max_tokens, max_len=256, num_workers=workers, **batching
    )
    stream = TokenBatchStream(data, "train", cfg, epochs=1)
    t0 = time.perf_counter()
    first = None
    tokens = padded = samples = batches = all_tokens = 0
    for b in stream:
        all_tokens += b.n_src_tokens + b.n_tgt_tokens
        if first is None:
            first = time.perf_counter()  # worker start-up and the first window are behind
            continue
        tokens += b.n_src_tokens + b.n_tgt_tokens
        padded += b.src.numel() + b.tgt_out.numel()
        samples += len(b)
        batches += 1
        if time.perf_counter() - first > seconds:
            break
    end = time.perf_counter()
    dt = end - (first or t0)
    return {
        "tokens_s": tokens / dt,
        "tokens_s_with_start": all_tokens / (end - t0),
        "samples_s": samples / dt,
        "batches_s": batches / dt,
        "startup_s": (first or t0) - t0,
        "padding": 1 - tokens / max(1, padded),
        "seconds": dt,
    }


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the sections the command line asks for; print their tables, write their rows."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--corpus",
        type=Path,
        help="train/valid/test (default /tmp/corpus-real; --smoke: synthetic)",
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/bench-data"), help="scratch directory")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--seconds", type=float, default=10.0, help="per loader measurement")
    p.add_argument("--pairs", type=int, nargs="*", default=[250_000, 1_000_000])
    p.add_argument(
        "--spm-sentences",
        type=int,
        default=2_000_000,
        help="prepare's input_sentence_size for the --pairs runs (default: prepare's, 2M)",
    )
    p.add_argument("--skip-loader", action="store_true")
    p.add_argument("--prepare-only", action="store_true", help="only the --pairs runs (4.)")
    add_output_arguments(p, "a 2,000-pair synthetic corpus, vocabulary 200, 0.5 s loader runs")
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    if a.smoke:
        a.vocab_size, a.seconds, a.pairs, a.spm_sentences = 200, 0.5, [3000], 5000
        if a.corpus is None:
            a.corpus = smoke_corpus(a.work)
    if a.corpus is None:
        a.corpus = Path("/tmp/corpus-real")
    print(f"# bench.data  corpus={a.corpus}  load average {os.getloadavg()[0]:.1f} at start")

    rows: list[Row] = []
    if not a.prepare_only:
        rows += measure_data(a)
    if a.pairs:
        rows += measure_prepare(a)
    print(f"\n# load average {os.getloadavg()[0]:.1f} at the end")
    write_rows(a.json, [{**r, "corpus": str(a.corpus)} for r in rows])
    return 0


def measure_data(a: argparse.Namespace) -> list[Row]:
    """Sections 1-3 (and 4's input order with the loader): shard bytes, loader tokens/s,
    padding; their rows."""
    data, rows = measure_shards(a)
    if not a.skip_loader:
        rows += measure_loader(a, data)
        rows += measure_order(a, data["tar"])
    rows += measure_padding(a, data["tar"])
    return rows


def measure_shards(a: argparse.Namespace) -> tuple[dict[str, Path], list[Row]]:
    """Section 1: the corpus prepared into plain and gzip shards; the data dir of each kind and
    the rows of their bytes per sample and shard-stage pairs/s."""
    rows: list[Row] = []
    data: dict[str, Path] = {}
    prep: dict[str, dict[str, Any]] = {}
    for kind, compress in (("tar", False), ("tar.gz", True)):
        data[kind] = a.work / f"data-{kind}"
        log(f"prepare {a.corpus} -> {data[kind]}")
        prep[kind] = run_prepare(
            a.corpus, data[kind], vocab_size=a.vocab_size, workers=2, compress_shards=compress
        )
    print("\n## shards (prepare of the real corpus, 2 workers)")
    print(f"{'shards':8} {'train pairs':>11} {'bytes/sample':>12} {'pairs/s':>9} {'spm s':>6}")
    for kind, r in prep.items():
        print(
            f"{kind:8} {r['manifest']['splits']['train']['samples']:>11} "
            f"{r['bytes_per_sample']:>12.0f} {r['lines'] / r['shard_s']:>9.0f} {r['spm_s']:>6.1f}"
        )
        rows.append(row(f"shard bytes per sample, {kind}", r["bytes_per_sample"], "bytes",
                        shards=kind))  # fmt: skip
        rows.append(row(f"prepare shard stage, {kind}", r["lines"] / r["shard_s"], "pairs/s",
                        shards=kind, workers=2))  # fmt: skip
    return data, rows


def measure_loader(a: argparse.Namespace, data: dict[str, Path]) -> list[Row]:
    """Section 2: loader tokens/s of every shard kind with 0 and 1 workers; their rows."""
    rows: list[Row] = []
    print(f"\n## loader: one TokenBatchStream, train, max_tokens {a.max_tokens}")
    print(
        f"{'shards':8} {'workers':>7} {'tokens/s':>10} {'samples/s':>10} {'batches/s':>9} "
        f"{'start s':>7} {'w/ start':>10}"
    )
    for kind in data:
        for workers in (0, 1):
            r = loader_rate(data[kind], workers, a.max_tokens, a.seconds)
            print(
                f"{kind:8} {workers:>7} {r['tokens_s']:>10.0f} {r['samples_s']:>10.0f} "
                f"{r['batches_s']:>9.1f} {r['startup_s']:>7.2f} "
                f"{r['tokens_s_with_start']:>10.0f}"
            )
            case = {"shards": kind, "workers": workers, "max_tokens": a.max_tokens}
            rows.append(row(f"loader, {kind}, {workers} workers", r["tokens_s"], "tokens/s",
                            startup_s=r["startup_s"], **case))  # fmt: skip
    return rows


def measure_padding(a: argparse.Namespace, data: Path) -> list[Row]:
    """Section 3: padding of the training split of `data` at every setting of PADDING_ROWS;
    their rows."""
    rows: list[Row] = []
    lens = read_lengths(data, 256)
    n = sum(len(x) for x in lens)
    mean_s = np.mean([s for x in lens for s, _ in x])
    mean_t = np.mean([t for x in lens for _, t in x])
    print(
        f"\n## padding at max_tokens {a.max_tokens} ({n} train pairs, mean S {mean_s:.1f}, "
        f"mean T {mean_t:.1f}); fractions of padded tokens, both sides"
    )
    print(
        f"{'batching':8} {'pad_mult':>8} {'batch_mult':>10} {'bucket':>6} {'window':>7} "
        f"{'padding':>8} {'rounding':>8} {'mismatch':>8} {'fill':>6} {'batches':>7} {'rows':>6}"
    )
    for version, pm, bm, bw, window in PADDING_ROWS:
        r = padding_stats(
            lens,
            version=version,
            window=window,
            max_tokens=a.max_tokens,
            pad_multiple=pm,
            bucket_width=bw,
            batch_multiple=bm,
        )
        print(
            f"{'v' + str(version):8} {pm:>8} {bm:>10} {bw:>6} {window:>7} {r['padding']:>8.1%} "
            f"{r['rounding']:>8.1%} {r['mismatch']:>8.1%} {r['fill']:>6.1%} {r['batches']:>7} "
            f"{r['rows_multiple']:>6.1%}"
        )
        setting = f"v{version}, pad {pm}, batch multiple {bm}, bucket {bw}, window {window}"
        rows.append(row(f"padding, {setting}", 100 * r["padding"], "%",
                        rounding_pct=100 * r["rounding"], mismatch_pct=100 * r["mismatch"],
                        fill_pct=100 * r["fill"], batches=r["batches"],
                        max_tokens=a.max_tokens))  # fmt: skip
    return rows


ORDER_SETTINGS = {  # name: (max_tokens, window)
    "demo (tiny.yaml)": (1536, 4000),
    "defaults": (4096, 100_000),
}


def measure_order(a: argparse.Namespace, shuffled: Path) -> list[Row]:
    """Section 4: the same corpus in input order and shuffled, read by one stream each."""
    in_order = a.work / "data-tar-in-order"
    log(f"prepare {a.corpus} -> {in_order} (--no-shuffle)")
    run_prepare(a.corpus, in_order, vocab_size=a.vocab_size, workers=2, shuffle=False)
    print("\n## input order: loader tokens/s and padding, 1 worker (tokens/s: real tokens)")
    print(f"{'settings':18} {'order':9} {'tokens/s':>9} {'padding':>8}  ratio shuffled/in order")
    rows: list[Row] = []
    for name, (max_tokens, window) in ORDER_SETTINGS.items():
        if a.smoke:
            max_tokens, window = min(max_tokens, 512), min(window, 500)
        got = {}
        for order, data in (("in order", in_order), ("shuffled", shuffled)):
            got[order] = r = loader_rate(data, 1, max_tokens, a.seconds, shuffle_buffer=window)
            print(f"{name:18} {order:9} {r['tokens_s']:>9.0f} {r['padding']:>8.1%}")
            rows.append(row(f"loader by input order, {name}, {order}", r["tokens_s"],
                            "tokens/s", padding_pct=100 * r["padding"], max_tokens=max_tokens,
                            window=window, order=order))  # fmt: skip
        ratio = got["shuffled"]["tokens_s"] / got["in order"]["tokens_s"]
        print(f"{'':18} {'':9} {'':>9} {'':>8}  {ratio:.2f}x")
    return rows


def measure_prepare(a: argparse.Namespace) -> list[Row]:
    """Section 5: prepare pairs/s and peak memory against corpus size; their rows."""
    rows: list[Row] = []
    if a.pairs:
        print(f"\n## prepare, 2 workers, input_sentence_size {a.spm_sentences}")
        print(
            f"{'pairs':>9} {'wall s':>7} {'spm s':>6} {'shard s':>7} {'pairs/s':>8} "
            f"{'main MB':>8} {'child MB':>8} {'tree spm MB':>11} {'tree shard MB':>13}"
        )
        for pairs in a.pairs:
            corpus = make_corpus(a.corpus, a.work / f"corpus-{pairs}", pairs)
            log(f"prepare {pairs} pairs")
            r = run_prepare(
                corpus,
                a.work / f"data-{pairs}",
                vocab_size=a.vocab_size,
                workers=2,
                input_sentence_size=a.spm_sentences,
            )
            print(
                f"{pairs:>9} {r['wall']:>7.1f} {r['spm_s']:>6.1f} {r['shard_s']:>7.1f} "
                f"{r['lines'] / r['shard_s']:>8.0f} {r['main_kb'] / 1024:>8.0f} "
                f"{r['worker_kb'] / 1024:>8.0f} {r['spm_peak'] / 2**20:>11.0f} "
                f"{r['shard_peak'] / 2**20:>13.0f}"
            )
            case = {"pairs": pairs, "workers": 2, "spm_sentences": a.spm_sentences}
            rows += [
                row(f"prepare {pairs} pairs, shard stage", r["lines"] / r["shard_s"], "pairs/s",
                    wall_s=r["wall"], spm_s=r["spm_s"], **case),
                row(f"prepare {pairs} pairs, peak RSS main", r["main_kb"] / 1024, "MB", **case),
                row(f"prepare {pairs} pairs, peak RSS largest child", r["worker_kb"] / 1024,
                    "MB", **case),
                row(f"prepare {pairs} pairs, tree PSS sentencepiece stage",
                    r["spm_peak"] / 2**20, "MB", **case),
                row(f"prepare {pairs} pairs, tree PSS shard stage", r["shard_peak"] / 2**20,
                    "MB", **case),
            ]  # fmt: skip
            shutil.rmtree(a.work / f"data-{pairs}", ignore_errors=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
