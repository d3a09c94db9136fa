"""Padding of bench/data.py's section 3: the training split's (S, T) lengths as the loader
keeps them, batched like the loader batches them (batching v1, and v2/v3 through
data_pipeline.batching.plan_batches) window by window, and the padding each batching leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data_pipeline.batching import Sample, plan_batches, round_up
from data_pipeline.manifest import read_manifest
from data_pipeline.shards import iter_shard


def _plan_v1(
    samples: Sequence[Sample], max_tokens: int, pad_multiple: int, bucket_width: int, rng: Any
) -> list[list[int]]:
    """Batching v1: random order inside buckets of max(S, T), cut at `max_tokens`."""
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
