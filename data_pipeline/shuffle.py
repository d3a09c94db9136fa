"""A seeded, memory-bounded global shuffle of a split's pairs: a two-pass external shuffle.

Real corpora arrive grouped by source (WMT14's training text is Europarl, Common Crawl and News
Commentary one after another), and a shard - hence a loader window - would hold one source.
Pass 1 deals every pair to one of ``k`` bucket files on disk, drawn uniformly from the seed;
pass 2 reads one bucket at a time, permutes it in memory and yields it. Each pair lands at a
uniformly random place (a bucket is a uniform random subset, permuted uniformly), memory holds
one bucket (``bucket_bytes`` of text, ~3x that as Python strings), and the same input and seed
give the same order.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

BUCKET_BYTES = 64 << 20  # text per bucket held in memory in pass 2
_LEN = struct.Struct("<II")


def buckets_for(total_bytes: int, bucket_bytes: int = BUCKET_BYTES) -> int:
    """Bucket files for about `total_bytes` of text."""
    return max(1, -(-total_bytes // bucket_bytes))


def _write(f: object, src: str, tgt: str) -> int:
    a, b = src.encode("utf-8"), tgt.encode("utf-8")
    f.write(_LEN.pack(len(a), len(b)) + a + b)  # type: ignore[attr-defined]
    return _LEN.size + len(a) + len(b)


def _read(path: Path) -> list[tuple[str, str]]:
    data = path.read_bytes()
    out, i = [], 0
    while i < len(data):
        na, nb = _LEN.unpack_from(data, i)
        i += _LEN.size
        out.append((data[i : i + na].decode("utf-8"), data[i + na : i + na + nb].decode("utf-8")))
        i += na + nb
    return out


def shuffled(
    pairs: Iterable[tuple[str, str]],
    work_dir: Path,
    seed: int,
    expected_bytes: int,
    bucket_bytes: int = BUCKET_BYTES,
) -> Iterator[tuple[str, str]]:
    """`pairs` in a uniformly random order drawn from `seed` (see the module docstring).

    `expected_bytes` (about the text's size) sets the bucket count; `work_dir` holds the
    buckets and is removed at the end (also on an error or an early close)."""
    k = buckets_for(expected_bytes, bucket_bytes)
    rng = np.random.default_rng([seed, 0x5F1E])
    work_dir.mkdir(parents=True, exist_ok=True)
    paths = [work_dir / f"bucket-{i:05d}.bin" for i in range(k)]
    try:
        files = [open(p, "wb", buffering=1 << 20) for p in paths]  # noqa: SIM115
        try:
            draws = rng.integers(k, size=4096)
            for n, (src, tgt) in enumerate(pairs):
                if n % 4096 == 0 and n:
                    draws = rng.integers(k, size=4096)
                _write(files[draws[n % 4096]], src, tgt)
        finally:
            for f in files:
                f.close()
        for p in paths:
            bucket = _read(p)
            p.unlink()
            for i in rng.permutation(len(bucket)):
                yield bucket[i]
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
