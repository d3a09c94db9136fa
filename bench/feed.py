"""The loader against a consumer that plays a GPU: does the feed keep up, and where does it stall?

Each rank (a process of its own, `ranks` of them, as on one node) reads the training split with
`TokenBatchStream` at the given data settings (the defaults: one worker per rank, 100,000-sample
windows) and takes each batch as a device would: it sleeps for the batch's real tokens / `rate`
(tokens/s of source + target per rank), then asks for the next one. Reported per rank: the
tokens/s delivered, the share of the time it waited for a batch, the longest wait, the longest
wait at a shuffle-window boundary (where a worker reads and decodes its next window) and the
waits over 50 ms, all after the first batch (the start-up is its own row).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path
from queue import Empty
from typing import Any

from bench.common import ROOT, Row, row
from bench.data import run_prepare
from data_pipeline.config import DataConfig, has_packed
from data_pipeline.corpus.synthetic import write_synthetic
from data_pipeline.loader import TokenBatchStream, read_manifest
from data_pipeline.worker_server import start_early

STALL_S = 0.05  # a wait longer than this counts as a stall
# side by side: the tars read ahead (the store before the packed ids), the packed ids with each
# window read when its turn comes, the packed ids read ahead but each batch received from the
# workers when the consumer asks for it, and the defaults (packed ids, read ahead, received
# ahead in a thread)
VARIANTS = (
    {"store": "tar", "read_ahead": 1, "prefetch": 0},
    {"store": "packed", "read_ahead": 0, "prefetch": 0},
    {"store": "packed", "read_ahead": 1, "prefetch": 0},
    {"store": "packed", "read_ahead": 1, "prefetch": 4},
)


def windows_of(stream: TokenBatchStream) -> tuple[tuple[int, int, int], ...]:
    """Each worker's (epoch, unit, window start) as of the last delivered batch."""
    return tuple(
        (w["epoch"], w["unit_index"], w["window_start"]) for w in stream.state_dict()["workers"]
    )


def consume(
    data: str, settings: dict[str, Any], rank: int, ranks: int, rate: float, seconds: float
) -> dict[str, float]:
    """One rank's consumer (see the module docstring); its figures."""
    cfg = DataConfig(dir=data, **settings)
    start_early(cfg.num_workers)  # the loader's fork server, as a rank starts it (trainer/loop.py)
    stream = TokenBatchStream(Path(data), "train", cfg, rank=rank, world_size=ranks)
    start = time.perf_counter()
    batches = iter(stream)
    first = next(batches)
    began = time.perf_counter()
    startup = began - start
    time.sleep((first.n_src_tokens + first.n_tgt_tokens) / rate)
    tokens = waited = longest = longest_window = 0.0
    stalls = n = 0
    where = windows_of(stream)
    while time.perf_counter() - began < seconds:
        t0 = time.perf_counter()
        batch = next(batches, None)
        wait = time.perf_counter() - t0
        if batch is None:
            break
        now = windows_of(stream)
        if now != where:
            longest_window = max(longest_window, wait)
        where = now
        waited += wait
        longest = max(longest, wait)
        stalls += wait > STALL_S
        n += 1
        real = batch.n_src_tokens + batch.n_tgt_tokens
        tokens += real
        time.sleep(real / rate)  # the device's work
    elapsed = time.perf_counter() - began
    stream.close()
    return {
        "tokens_per_s": tokens / elapsed,
        "wait_pct": 100 * waited / elapsed,
        "longest_wait_ms": 1000 * longest,
        "longest_window_wait_ms": 1000 * longest_window,
        "stalls": stalls,
        "batches": n,
        "startup_s": startup,
    }


def _rank_main(queue: Any, *args: Any) -> None:
    queue.put((args[2], consume(*args)))


def measure(
    work: Path,
    corpus: str | None = None,
    smoke: bool = False,
    rate: float = 1e6,
    ranks: int = 2,
    seconds: float = 30.0,
    vocab_size: int = 8000,
    settings: dict[str, Any] | None = None,
    variants: tuple[dict[str, Any], ...] = VARIANTS,
) -> list[Row]:
    """`ranks` consumers at `rate` tokens/s each for `seconds` on `corpus` prepared at
    `vocab_size` (None: synthetic pairs), at the data defaults updated by `settings`, once per
    variant of them (VARIANTS, side by side)."""
    src = Path(ROOT, corpus) if corpus else work / "corpus-synthetic"
    if not corpus:
        write_synthetic(src, n_train=4000 if smoke else 200_000, n_valid=20, n_test=20, seed=1)
    data = work / "data"  # kept from an earlier run where it holds the packed ids
    if not (
        (data / "manifest.json").is_file()
        and has_packed(read_manifest(data)["splits"]["train"]["shards"])
    ):
        run_prepare(src, data, vocab_size=200 if smoke else vocab_size)
    rows: list[Row] = []
    for variant in variants:
        rows += feed_rows(data, {"max_len": 256, **(settings or {}), **variant}, variant, rate,
                          ranks, seconds, str(corpus or "synthetic"))  # fmt: skip
    return rows


def gather(queue: Any, procs: list[Any], timeout: float) -> dict[int, dict[str, float]]:
    """Each rank's figures from `queue`; a rank that exits without them ends the bench at once
    (its traceback is in the log above), not after `timeout`."""
    results: dict[int, dict[str, float]] = {}
    deadline = time.monotonic() + timeout
    while len(results) < len(procs):
        try:
            rank, got = queue.get(timeout=1.0)
            results[rank] = got
            continue
        except Empty:
            pass
        dead = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"feed: rank {dead[0][0]} exited with {dead[0][1]} before its "
                               "figures")  # fmt: skip
        if time.monotonic() > deadline:
            raise RuntimeError(f"feed: no figures from every rank within {timeout:.0f} s")
    return results


def feed_rows(
    data: Path, settings: dict[str, Any], variant: dict[str, Any], rate: float, ranks: int,
    seconds: float, corpus: str,
) -> list[Row]:  # fmt: skip
    """One variant: every rank's consumer at once, each in a process of its own."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_rank_main, args=(queue, str(data), settings, r, ranks, rate, seconds))
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    results = gather(queue, procs, seconds + 600)
    for p in procs:
        p.join(timeout=60)
    case = {"rate": rate, "ranks": ranks, "corpus": corpus, **settings}
    name = ", ".join(f"{k} {v}" for k, v in variant.items())
    rows: list[Row] = []
    for r in sorted(results):
        got = results[r]
        label = f"{name}: rank {r} of {ranks} at {rate:,.0f} tokens/s"
        rows += [
            row(f"{label}: delivered", got["tokens_per_s"], "tokens/s", rank=r, **case),
            row(f"{label}: time waiting", got["wait_pct"], "%", rank=r, **case),
            row(f"{label}: longest wait", got["longest_wait_ms"], "ms", rank=r, **case),
            row(f"{label}: longest wait at a window boundary", got["longest_window_wait_ms"],
                "ms", rank=r, **case),
            row(f"{label}: waits over {1000 * STALL_S:.0f} ms", got["stalls"], "waits",
                batches=got["batches"], rank=r, **case),
            row(f"{label}: start-up to the first batch", got["startup_s"], "s", rank=r, **case),
        ]  # fmt: skip
    return rows
