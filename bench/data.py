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
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Row, add_output_arguments, row, write_rows
from data_pipeline.batching import Sample, plan_batches, round_up
from data_pipeline.config import DataConfig
from data_pipeline.loader import TokenBatchStream
from data_pipeline.manifest import read_manifest
from data_pipeline.shards import iter_shard

ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# prepare in a subprocess, with its memory


_PREPARE_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from data_pipeline.prepare import prepare
args = json.loads(sys.argv[1])
marks = []
t0 = time.monotonic()
def log(msg):
    marks.append([time.monotonic() - t0, msg])
print(json.dumps({"t0": t0}), flush=True)
m = prepare(Path(args["corpus"]), Path(args["out"]), log=log, progress=False, **args["kw"])
self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"wall": time.monotonic() - t0, "marks": marks, "main_kb": self_kb,
                  "worker_kb": child_kb, "manifest": m}))
"""


def _tree_rss(pid: int) -> int:
    """Sum of the PSS (bytes) of a process and its descendants, from /proc."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with the dev tools
        return 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            # PSS: pages shared after fork (copy-on-write) are counted once in the sum.
            total += p.memory_full_info().pss
    return total


def run_prepare(corpus: Path, out: Path, **kw: Any) -> dict[str, Any]:
    """``prepare`` in a fresh subprocess; its result, timings and peak memory."""
    shutil.rmtree(out, ignore_errors=True)
    args = json.dumps({"corpus": str(corpus), "out": str(out), "kw": kw})
    proc = subprocess.Popen(
        [sys.executable, "-c", _PREPARE_CHILD, args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    timeline: list[tuple[float, int]] = []  # (monotonic time, tree PSS)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            timeline.append((time.monotonic(), _tree_rss(proc.pid)))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, _ = proc.communicate()
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"prepare of {corpus} failed with exit code {proc.returncode}")
    lines = stdout.decode().strip().splitlines()
    t0 = json.loads(lines[0])["t0"]  # the child's start on the same monotonic clock
    res = json.loads(lines[-1])
    marks = res["marks"]
    spm_done = next(t for t, m in marks if "sentencepiece trained" in m)
    train_done = next(t for t, m in marks if m.startswith("prepare: train:"))
    res["tree_peak"] = max((m for _, m in timeline), default=0)
    res["spm_peak"] = max((m for t, m in timeline if t - t0 <= spm_done), default=0)
    res["shard_peak"] = max((m for t, m in timeline if t - t0 > spm_done), default=0)
    train = res["manifest"]["splits"]["train"]
    res["spm_s"] = spm_done
    res["shard_s"] = train_done - spm_done
    res["lines"] = train["cleaning"]["lines"]
    res["bytes_per_sample"] = sum(s["bytes"] for s in train["shards"]) / max(1, train["samples"])
    return res


def make_corpus(real: Path, out: Path, pairs: int) -> Path:
    """``pairs`` training pairs from ``real``'s (repetition r rotates the words by r) plus its
    valid/test files."""
    out.mkdir(parents=True, exist_ok=True)
    done = out / "n"
    if (out / "train.en").is_file() and done.is_file() and done.read_text() == str(pairs):
        return out
    en = (real / "train.en").read_text(encoding="utf-8").splitlines()
    de = (real / "train.de").read_text(encoding="utf-8").splitlines()

    def rotate(line: str, r: int) -> str:
        words = line.split()
        k = r % len(words) if words else 0
        return " ".join(words[k:] + words[:k])

    with (
        open(out / "train.en", "w", encoding="utf-8") as fe,
        open(out / "train.de", "w", encoding="utf-8") as fd,
    ):
        for n in range(pairs):
            r, i = divmod(n, len(en))
            fe.write((rotate(en[i], r) if r else en[i]) + "\n")
            fd.write((rotate(de[i], r) if r else de[i]) + "\n")
    for split in ("valid", "test"):
        for lang in ("en", "de"):
            if (real / f"{split}.{lang}").is_file():
                shutil.copyfile(real / f"{split}.{lang}", out / f"{split}.{lang}")
    (out / "n").write_text(str(pairs))
    return out


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
# padding


def _plan_v1(
    samples: Sequence[Sample], max_tokens: int, pad_multiple: int, bucket_width: int, rng: Any
) -> list[list[int]]:
    """The batching before this change: random order inside buckets of max(S, T)."""
    order = sorted(
        rng.permutation(len(samples)).tolist(),
        key=lambda i: (max(samples[i].src_len, samples[i].tgt_len) - 1) // bucket_width,
    )
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_s = cur_t = 0
    for i in order:
        s = round_up(max(cur_s, samples[i].src_len), pad_multiple)
        t = round_up(max(cur_t, samples[i].tgt_len), pad_multiple)
        if cur and (len(cur) + 1) * max(s, t) > max_tokens:
            batches.append(cur)
            cur, cur_s, cur_t = [], 0, 0
        cur.append(i)
        cur_s = max(cur_s, samples[i].src_len)
        cur_t = max(cur_t, samples[i].tgt_len)
    if cur:
        batches.append(cur)
    return batches


def read_lengths(data: Path, max_len: int) -> list[list[tuple[int, int]]]:
    """(S, T) of every training sample the loader keeps, per shard, in file order."""
    m = read_manifest(data)
    out = []
    for shard in m["splits"]["train"]["shards"]:
        lens = []
        item = 2 if m["dtype"] == "uint16" else 4
        for raw in iter_shard(data / shard["name"]):
            s = len(raw.parts["src.ids"]) // item
            t = len(raw.parts["tgt.ids"]) // item + 1
            if max(s, t) <= max_len:
                lens.append((s, t))
        out.append(lens)
    return out


def padding_stats(
    shards: list[list[tuple[int, int]]],
    *,
    version: int,
    window: int,
    max_tokens: int,
    pad_multiple: int,
    bucket_width: int,
    batch_multiple: int = 1,
    seed: int = 1,
) -> dict[str, float]:
    """Padding of one epoch batched like the loader does (windows of ``window`` per shard)."""
    real = padded = floor = n_batches = aligned = 0
    empty = np.zeros(0, dtype=np.int64)
    for k, lens in enumerate(shards):
        for ws in range(0, len(lens), window):
            chunk = lens[ws : ws + window]
            samples = [Sample("", np.zeros(s, np.int64), np.zeros(t - 1), "", "") for s, t in chunk]
            rng = np.random.default_rng([seed, 0, k, 0, 1, ws])
            if version == 1:
                groups = _plan_v1(samples, max_tokens, pad_multiple, bucket_width, rng)
            else:
                groups = plan_batches(
                    samples,
                    max_tokens=max_tokens,
                    pad_multiple=pad_multiple,
                    bucket_width=bucket_width,
                    rng=rng,
                    batch_multiple=batch_multiple,
                )
            for g in groups:
                s = np.array([chunk[i][0] for i in g] or empty)
                t = np.array([chunk[i][1] for i in g] or empty)
                b = len(g)
                s_pad = round_up(int(s.max()), pad_multiple)
                t_pad = round_up(int(t.max()), pad_multiple)
                real += int(s.sum() + t.sum())
                padded += b * (s_pad + t_pad)
                floor += sum(round_up(int(x), pad_multiple) - int(x) for x in (*s, *t))
                n_batches += 1
                aligned += (b * s_pad) % 8 == 0 and (b * t_pad) % 8 == 0
    return {
        "padding": (padded - real) / padded,
        "rounding": floor / padded,
        "mismatch": (padded - real - floor) / padded,
        "fill": real / (n_batches * 2 * max_tokens),
        "batches": n_batches,
        "rows_multiple": aligned / max(1, n_batches),  # batches whose B*S and B*T % 8 == 0
    }


# (batching version, pad_multiple, batch_multiple, bucket_width, window): the settings before
# batching v3 (v1 and v2 at pad 8, bucket 8, window 2,000), then v3 at the defaults and around.
PADDING_ROWS = [
    (1, 8, 1, 8, 2000),
    (2, 8, 1, 8, 2000),
    (3, 8, 8, 1, 100_000),
    (3, 1, 1, 1, 16_000),
    (3, 1, 8, 1, 2_000),
    (3, 1, 8, 1, 16_000),
    (3, 1, 8, 1, 100_000),
]

# --------------------------------------------------------------------------------------------


def smoke_corpus(work: Path) -> Path:
    """A small synthetic corpus (train/valid/test .en/.de) under `work`, written once."""
    from data_pipeline.corpus.synthetic import write_synthetic

    out = work / "corpus-smoke"
    if not (out / "corpus.json").is_file():
        write_synthetic(out, n_train=2000, n_valid=50, n_test=50, seed=1)
    return out


def main(argv: list[str] | None = None) -> int:
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
    """Sections 1-3: shard bytes, loader tokens/s, padding; their rows."""
    rows: list[Row] = []
    # 1. shards: plain and gzip.
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

    # 2. loader.
    if not a.skip_loader:
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

    if not a.skip_loader:
        rows += measure_order(a, data["tar"])

    # 3. padding.
    lens = read_lengths(data["tar"], 256)
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
    """Section 4: prepare pairs/s and peak memory against corpus size; their rows."""
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
