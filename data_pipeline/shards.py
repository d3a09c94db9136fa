"""Writing and reading webdataset tar shards of token-id pairs.

A shard is a plain tar (the webdataset convention): the members of one sample share a key,
``<key>.src.ids``, ``<key>.tgt.ids``, ``<key>.src.txt``, ``<key>.tgt.txt``, next to each other.
Ids are little-endian ``uint16`` (vocabularies below 65536) or ``uint32`` raw bytes: the
source ends with EOS (the model's source convention); the target carries neither BOS nor EOS
(the loader adds them).  Tars are written with fixed metadata so the same input gives the same
bytes and sha256, which lets an interrupted ``prepare`` verify what it already wrote.

Reading is done by a small tar reader here rather than through ``webdataset``'s pipeline,
because the loader needs the exact sample index inside a shard (to resume, seeking over the
bytes of earlier samples) and precise accounting of what a corrupt or truncated shard lost.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from data_pipeline.tokenizer import EOS_ID

PARTS = ("src.ids", "tgt.ids", "src.txt", "tgt.txt")  # members of every sample
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
        self._tar = tarfile.open(self.tmp, "w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115
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


BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)


def _octal(field: bytes) -> int:
    """A numeric tar header field: NUL/space-terminated octal, or GNU base-256."""
    if field and field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _tar_members(f: BinaryIO, want: Callable[[str], bool]) -> Iterator[tuple[str, bytes | None]]:
    """``(name, data)`` of the regular files of a tar stream; ``data`` is ``None`` where
    ``want(name)`` is false (its bytes are seeked over, not read).

    A small ustar/GNU/pax reader instead of :mod:`tarfile`: an order of magnitude faster per
    member (which matters for four members per sample and for seeking on resume), and strict:
    a damaged header raises ``ValueError`` instead of quietly ending the archive.  A file that
    ends exactly between members ends the stream quietly (callers compare with the manifest).
    """
    long_name: str | None = None
    while True:
        header = f.read(BLOCK)
        if not header or header == _ZERO_BLOCK:
            return
        if len(header) < BLOCK:
            raise ValueError("truncated tar header")
        try:
            stored = _octal(header[148:156])
            size = _octal(header[124:136])
        except ValueError:
            raise ValueError(f"invalid tar header at byte {f.tell() - BLOCK}") from None
        if stored != sum(header[:148]) + 256 + sum(header[156:]):
            raise ValueError(f"bad tar header checksum at byte {f.tell() - BLOCK}")
        kind = header[156:157]
        padded = -(-size // BLOCK) * BLOCK
        if kind in (b"L", b"x"):  # GNU long name / pax extended header for the next member
            meta = f.read(padded)[:size]
            if len(meta) < size:
                raise ValueError("unexpected end of data")
            if kind == b"L":
                long_name = meta.split(b"\0", 1)[0].decode("utf-8", "replace")
            else:
                for record in meta.split(b"\n"):
                    if b" path=" in record:
                        long_name = record.split(b" path=", 1)[1].decode("utf-8", "replace")
            continue
        name = long_name
        long_name = None
        if name is None:
            name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
            if header[257:262] == b"ustar" and header[345] != 0:
                prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
                name = f"{prefix}/{name}"
        if kind not in (b"0", b"\0", b"7") or not want(name):
            f.seek(padded, io.SEEK_CUR)
            if kind in (b"0", b"\0", b"7"):
                yield name, None
            continue
        data = f.read(padded)
        if len(data) < size:
            raise ValueError("unexpected end of data")
        yield name, data[:size]


def iter_shard(path: Path, skip_before: int = 0) -> Iterator[RawSample]:
    """Samples of a tar shard in file order, grouped by key (``RawSample.index`` counts them).

    Samples with ``index < skip_before`` come with empty ``parts``: their bytes are not read
    (resuming in the middle of a shard only reads headers up to there).  Raises
    :class:`ShardReadError` when the shard is missing or damaged part-way (the complete samples
    before the damage have been yielded; the one being read is lost).  A tar truncated exactly
    between members ends silently, which is why callers compare the count with the manifest.
    """
    index = 0
    key: str | None = None
    parts: dict[str, bytes] = {}

    def want(name: str) -> bool:
        # The member belongs to sample `index`, or starts sample `index + 1`.
        k = name.rsplit("/", 1)[-1].split(".", 1)[0]
        return (index if k == key or key is None else index + 1) >= skip_before

    try:
        with open(path, "rb", buffering=1 << 20) as f:
            for name, data in _tar_members(f, want):
                base = name.rsplit("/", 1)[-1]
                if "." not in base:
                    continue
                k, ext = base.split(".", 1)
                if k != key:
                    if key is not None:
                        yield RawSample(index, key, parts)
                        index += 1
                    key, parts = k, {}
                if data is not None:
                    parts[ext] = data
    except (OSError, ValueError) as exc:
        raise ShardReadError(f"{path.name}: {exc}") from None
    if key is not None:
        yield RawSample(index, key, parts)


def decode_sample(sample: RawSample, dtype: str, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(src ids incl. EOS, tgt ids without BOS/EOS) of a sample; ``ValueError`` if malformed."""
    missing = [p for p in PARTS if p not in sample.parts]
    if missing:  # e.g. the last sample of a shard cut between its members
        raise ValueError(f"{sample.key}: missing {', '.join(missing)}")
    src = bytes_to_ids(sample.parts["src.ids"], dtype)
    tgt = bytes_to_ids(sample.parts["tgt.ids"], dtype)
    if len(src) == 0 or int(src[-1]) != EOS_ID:
        raise ValueError(f"{sample.key}: source does not end with EOS")
    if (len(src) and int(src.max()) >= vocab_size) or (len(tgt) and int(tgt.max()) >= vocab_size):
        raise ValueError(f"{sample.key}: id beyond vocab_size={vocab_size}")
    return src, tgt
