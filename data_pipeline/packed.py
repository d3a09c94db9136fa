"""The packed token store: a shard's ids in one file the loader maps into memory.

Beside each tar shard (``shards/train-000000.tar``) ``prepare`` writes ``train-000000.ids``
with the same samples in the same order, ids only: the training stream reads it instead of
parsing four tar members per sample (~60 us a sample, the loader's bottleneck: bench data and
bench feed). The tar stays the archive of record, and the only copy of the text (BLEU,
``translate``); the manifest lists both files with their size and sha256.

Layout (little-endian)::

    magic    8 bytes  b"PSIDS\\0\\0\\1"
    length   4 bytes  of the JSON header that follows
    header   JSON     {"dtype": "uint16", "samples": N, "tokens": M, "key_prefix": "train-000000-"}
    (zeros up to a multiple of 64 bytes)
    index    N x 4 int64: token offset, source length (with EOS), target length, input line
    tokens   M ids of `dtype`: each sample's source then its target, samples back to back

Sample i's key is ``key_prefix`` + its line as 7 digits, as in the tar. Opening checks the
file against the manifest (size, sample count) and its own structure (offsets back to back,
ending at M): a failure there is a damaged file (``PackedError``), which the loader answers by
reading the shard's tar. Samples with a source not ending in EOS or an id beyond the vocabulary
are marked bad, as the tar reader finds malformed samples, and skipped and counted the same.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from data_pipeline.shards import DTYPES, decode_sample, iter_shard, sha256_file
from data_pipeline.tokenizer import EOS_ID

if TYPE_CHECKING:  # batching imports torch, which `paperscale prepare` (packing) never needs
    from data_pipeline.batching import Rows

MAGIC = b"PSIDS\0\0\1"
SUFFIX = ".ids"
ALIGN = 64
INDEX_COLUMNS = 4  # offset, source length, target length, line


def packed_name(shard_name: str) -> str:
    """``shards/train-000000.tar`` (or ``.tar.gz``, ``.tgz``) -> ``shards/train-000000.ids``."""
    for suffix in (".tar.gz", ".tgz", ".tar"):
        if shard_name.endswith(suffix):
            return shard_name.removesuffix(suffix) + SUFFIX
    return shard_name + SUFFIX


class PackedError(Exception):
    """A packed file that cannot be read as the manifest describes it (one line)."""


class PackedWriter:
    """Collects one shard's samples; :meth:`close` writes the file under a temporary name,
    fsyncs and renames it into place, as the tar writer does."""

    def __init__(self, path: Path, dtype: str, key_prefix: str) -> None:
        self.path, self.dtype, self.key_prefix = Path(path), dtype, key_prefix
        self.rows: list[tuple[int, int, int, int]] = []
        self.parts: list[np.ndarray] = []
        self.tokens = 0

    def write(self, line: int, src_ids: list[int], tgt_ids: list[int]) -> None:
        """One sample (``src_ids`` ends with EOS; ``tgt_ids`` has no BOS/EOS)."""
        ids = np.asarray([*src_ids, *tgt_ids], dtype=DTYPES[self.dtype])
        self.rows.append((self.tokens, len(src_ids), len(tgt_ids), line))
        self.parts.append(ids)
        self.tokens += len(ids)

    def close(self) -> tuple[str, int]:
        """Write, fsync, rename; returns (sha256, bytes)."""
        head = json.dumps(
            {"dtype": self.dtype, "samples": len(self.rows), "tokens": self.tokens,
             "key_prefix": self.key_prefix}, separators=(",", ":"),
        ).encode()  # fmt: skip
        start = len(MAGIC) + 4 + len(head)
        pad = -start % ALIGN
        index = np.asarray(self.rows, dtype="<i8").reshape(len(self.rows), INDEX_COLUMNS)
        tokens = np.concatenate(self.parts) if self.parts else np.zeros(0, DTYPES[self.dtype])
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(head)) + head + bytes(pad))
                f.write(index.tobytes())
                f.write(tokens.astype(DTYPES[self.dtype], copy=False).tobytes())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
        return sha256_file(self.path), self.path.stat().st_size


class PackedShard:
    """One packed file mapped read-only: its index, ids and which samples are bad."""

    def __init__(self, data_dir: Path, entry: dict, dtype: str, vocab_size: int) -> None:
        """`entry`: the shard's manifest entry (``samples``, ``packed`` with ``name`` and
        ``bytes``). The map stays open while any of its arrays or samples' ids does."""
        name = entry["packed"]["name"]
        self.path = Path(data_dir, name)
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            raise PackedError(f"{name}: missing") from None
        if size != entry["packed"]["bytes"]:
            raise PackedError(f"{name}: {size} bytes, manifest says {entry['packed']['bytes']}")
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        buf = self._map if self._map is not None else b""
        head = self._header(buf, name)
        if head.get("dtype") != dtype or head.get("samples") != entry["samples"]:
            raise PackedError(f"{name}: header {head} does not match the manifest")
        n, m = int(head["samples"]), int(head["tokens"])
        start = len(MAGIC) + 4 + struct.unpack_from("<I", buf, len(MAGIC))[0]
        start += -start % ALIGN
        itemsize = DTYPES[dtype].itemsize
        if size != start + n * INDEX_COLUMNS * 8 + m * itemsize:
            raise PackedError(f"{name}: {size} bytes where its header gives another size")
        self.key_prefix = str(head["key_prefix"])
        self.index = np.frombuffer(buf, "<i8", n * INDEX_COLUMNS, start).reshape(n, INDEX_COLUMNS)
        self.tokens = np.frombuffer(buf, DTYPES[dtype], m, start + n * INDEX_COLUMNS * 8)
        self._check_offsets(name, m)
        self.bad = self._bad_samples(vocab_size)

    @staticmethod
    def _header(buf: bytes | mmap.mmap, name: str) -> dict:
        if len(buf) < len(MAGIC) + 4 or buf[: len(MAGIC)] != MAGIC:
            raise PackedError(f"{name}: not a packed ids file (bad magic)")
        (length,) = struct.unpack_from("<I", buf, len(MAGIC))
        raw = buf[len(MAGIC) + 4 : len(MAGIC) + 4 + length]
        try:
            head = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise PackedError(f"{name}: unreadable header") from None
        fields = {"dtype": str, "samples": int, "tokens": int, "key_prefix": str}
        if not isinstance(head, dict) or any(
            not isinstance(head.get(k), kind) for k, kind in fields.items()
        ):
            raise PackedError(f"{name}: unreadable header")
        return head

    def _check_offsets(self, name: str, m: int) -> None:
        """Samples back to back from offset 0 to the last id, no length negative."""
        off, s, t = self.index[:, 0], self.index[:, 1], self.index[:, 2]
        ends = off + s + t
        ok = bool((s >= 0).all() and (t >= 0).all()) and (len(off) == 0 or off[0] == 0)
        ok = ok and bool((off[1:] == ends[:-1]).all()) and (len(off) == 0 or ends[-1] == m)
        if not ok:
            raise PackedError(f"{name}: its index does not cover its ids back to back")

    def _bad_samples(self, vocab_size: int) -> np.ndarray:
        """(N,) bool: the source is empty or does not end with EOS, or an id is >= vocab."""
        off, s = self.index[:, 0], self.index[:, 1]
        bad = s <= 0
        if len(self.tokens):  # (else every source is empty: all bad already)
            bad |= self.tokens[np.where(bad, 0, off + s - 1)] != EOS_ID
        beyond = np.flatnonzero(self.tokens >= vocab_size)
        if len(beyond):  # the sample each such id lies in
            bad[np.searchsorted(off, beyond, side="right") - 1] = True
        return bad

    def windows(
        self, first: int, stride: int, count: int, start: int, window: int, max_len: int | None
    ) -> Iterator[tuple[int, int, Rows, int, int]]:
        """The unit of samples ``first + k * stride`` (``k < count``) in windows of `window`
        from its sample `start` on: ``(window start, samples read, usable samples, bad ones,
        too long ones)``; with `max_len`, pairs longer on either side are left out (counted).
        The usable samples are arrays over the mapped ids: nothing is copied until a batch is."""
        from data_pipeline.batching import Rows

        for ws in range(start, count, window):
            n = min(window, count - ws)
            picked = first + (ws + np.arange(n)) * stride  # (n,) sample numbers in the shard
            keep = ~self.bad[picked]
            bad = n - int(keep.sum())
            too_long = 0
            if max_len is not None:
                index = self.index[picked]  # (n, 4)
                long = keep & (np.maximum(index[:, 1], index[:, 2] + 1) > max_len)
                too_long = int(long.sum())
                keep &= ~long
            index = self.index[picked[keep]]  # (usable, 4)
            rows = Rows(self.tokens, index[:, 0], index[:, 1], index[:, 2], index[:, 3],
                        self.key_prefix)  # fmt: skip
            yield ws, n, rows, bad, too_long


def pack_tar(root: Path, name: str, dtype: str) -> dict[str, object]:
    """Write the packed ids of tar shard `name` (under `root`) from the tar itself; returns its
    manifest entry. For a data dir whose tars were written before the packed store."""
    writer: PackedWriter | None = None
    for raw in iter_shard(Path(root, name), text=False):
        src, tgt = decode_sample(raw, dtype, 1 << 32)
        prefix, line = raw.key.rsplit("-", 1)
        if writer is None:
            writer = PackedWriter(Path(root, packed_name(name)), dtype, prefix + "-")
        writer.write(int(line), src.tolist(), tgt.tolist())
    if writer is None:  # a shard without samples
        writer = PackedWriter(Path(root, packed_name(name)), dtype, "")
    sha, size = writer.close()
    return {"name": packed_name(name), "sha256": sha, "bytes": size}
