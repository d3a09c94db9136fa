"""Writing and reading webdataset tar shards of token-id pairs.

A shard is a plain tar (the webdataset convention): the members of one sample share a key,
``<key>.src.ids``, ``<key>.tgt.ids``, ``<key>.src.txt``, ``<key>.tgt.txt``, next to each other.
Ids are little-endian ``uint16`` (vocabularies below 65536) or ``uint32`` raw bytes: the
source ends with EOS (the model's source convention); the target carries neither BOS nor EOS
(the loader adds them).  Tars are written with fixed metadata so the same input gives the same
bytes and sha256, which lets an interrupted ``prepare`` verify what it already wrote.

Reading is done with :mod:`tarfile` in stream mode rather than through ``webdataset``'s
pipeline, because the loader needs the exact sample index inside a shard (to resume) and
precise accounting of what a corrupt or truncated shard lost.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_pipeline.tokenizer import EOS_ID

DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def dtype_for(vocab_size: int) -> str:
    """Narrowest id dtype name for a vocabulary."""
    return "uint16" if vocab_size <= 65536 else "uint32"


def ids_to_bytes(ids: list[int], dtype: str) -> bytes:
    """Little-endian raw bytes of ``ids``."""
    return np.asarray(ids, dtype=DTYPES[dtype]).tobytes()


def bytes_to_ids(data: bytes, dtype: str) -> np.ndarray:
    """Inverse of :func:`ids_to_bytes`; raises ``ValueError`` on a length that is not whole ids."""
    dt = DTYPES[dtype]
    if len(data) % dt.itemsize:
        raise ValueError(f"{len(data)} bytes is not a whole number of {dtype} ids")
    return np.frombuffer(data, dtype=dt)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks (shards can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class ShardWriter:
    """Writes one tar shard under a temporary name; :meth:`close` renames it into place.

    A reader (or a re-run of ``prepare``) therefore never sees a half-written shard under
    its final name.
    """

    def __init__(self, path: Path, dtype: str) -> None:
        self.path = Path(path)
        self.dtype = dtype
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self._tar = tarfile.open(self.tmp, "w", format=tarfile.USTAR_FORMAT)
        self.samples = 0

    def _add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = 0
        info.mode = 0o644
        info.uname = info.gname = ""
        self._tar.addfile(info, io.BytesIO(data))

    def write(self, key: str, src_ids: list[int], tgt_ids: list[int], src: str, tgt: str) -> None:
        """Append one sample (``src_ids`` already ends with EOS; ``tgt_ids`` has no BOS/EOS)."""
        self._add(f"{key}.src.ids", ids_to_bytes(src_ids, self.dtype))
        self._add(f"{key}.tgt.ids", ids_to_bytes(tgt_ids, self.dtype))
        self._add(f"{key}.src.txt", src.encode("utf-8"))
        self._add(f"{key}.tgt.txt", tgt.encode("utf-8"))
        self.samples += 1

    def close(self) -> tuple[str, int]:
        """Finish the tar, fsync, rename into place; returns (sha256, bytes)."""
        self._tar.close()
        with open(self.tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(self.tmp, self.path)
        return sha256_file(self.path), self.path.stat().st_size

    def abort(self) -> None:
        """Drop the temporary file (on an error)."""
        try:
            self._tar.close()
        finally:
            self.tmp.unlink(missing_ok=True)


@dataclass
class RawSample:
    """One sample as read from a shard: its index in the shard, key and member bytes."""

    index: int
    key: str
    parts: dict[str, bytes]


class ShardReadError(Exception):
    """The shard stopped being readable (tar error, missing file); ``read`` samples came first."""


def iter_shard(path: Path) -> Iterator[RawSample]:
    """Samples of a tar shard in file order, grouped by key.

    Raises :class:`ShardReadError` when the tar is unreadable part-way (the samples before the
    damage have been yielded).  A tar truncated exactly between members ends silently, which
    is why callers compare the count with the manifest.
    """
    try:
        tar = tarfile.open(path, mode="r|")
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise ShardReadError(f"{path.name}: {exc}") from None
    index = 0
    key: str | None = None
    parts: dict[str, bytes] = {}
    try:
        with tar:
            for member in tar:
                if not member.isfile():
                    continue
                base = member.name.rsplit("/", 1)[-1]
                if "." not in base:
                    continue
                k, ext = base.split(".", 1)
                f = tar.extractfile(member)
                data = f.read() if f is not None else b""
                if len(data) != member.size:
                    raise tarfile.ReadError("unexpected end of data")
                if k != key:
                    if key is not None:
                        yield RawSample(index, key, parts)
                        index += 1
                    key, parts = k, {}
                parts[ext] = data
    except (OSError, tarfile.TarError, EOFError, zlib.error) as exc:
        # The partly read sample is incomplete: it is lost with the rest of the shard.
        raise ShardReadError(f"{path.name}: {exc}") from None
    if key is not None:
        yield RawSample(index, key, parts)


def decode_sample(sample: RawSample, dtype: str, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(src ids incl. EOS, tgt ids without BOS/EOS) of a sample; ``ValueError`` if malformed."""
    if "src.ids" not in sample.parts or "tgt.ids" not in sample.parts:
        raise ValueError(f"{sample.key}: missing src.ids or tgt.ids")
    src = bytes_to_ids(sample.parts["src.ids"], dtype)
    tgt = bytes_to_ids(sample.parts["tgt.ids"], dtype)
    if len(src) == 0 or int(src[-1]) != EOS_ID:
        raise ValueError(f"{sample.key}: source does not end with EOS")
    if (len(src) and int(src.max()) >= vocab_size) or (len(tgt) and int(tgt.max()) >= vocab_size):
        raise ValueError(f"{sample.key}: id beyond vocab_size={vocab_size}")
    return src, tgt
