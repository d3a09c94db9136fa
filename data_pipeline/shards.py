"""Writing and reading webdataset tar shards of token-id pairs.

A shard is a plain tar (the webdataset convention): the members of one sample share a key,
``<key>.src.ids``, ``<key>.tgt.ids``, ``<key>.src.txt``, ``<key>.tgt.txt``, next to each other.
Ids are little-endian ``uint16`` (vocabularies below 65536) or ``uint32`` raw bytes: the
source ends with EOS (the model's source convention); the target carries neither BOS nor EOS
(the loader adds them).  Tars are written with fixed metadata so the same input gives the same
bytes and sha256, which lets an interrupted ``prepare`` verify what it already wrote.

A shard whose name ends in ``.gz`` (``prepare(..., compress_shards=True)``) is the same tar,
gzip-compressed (``train-000000.tar.gz``, fixed gzip header, so still reproducible): webdataset
and ``tarfile`` read it as they are, and it saves most of the fixed cost of the tar format
(four 512-byte headers per sample, each member padded to 512 bytes: ~4 KB per sample whatever
its length, which the zeros make almost free to compress).

Reading is done by a small tar reader here rather than through ``webdataset``'s pipeline,
because the loader needs the exact sample index inside a shard (to resume, seeking over the
bytes of earlier samples) and precise accounting of what a corrupt or truncated shard lost.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from data_pipeline.tokenizer import EOS_ID

PARTS = ("src.ids", "tgt.ids", "src.txt", "tgt.txt")  # members of every sample
TEXT_SUFFIX = ".txt"  # the text members, which only BLEU and `translate` read
BLOCK = 512  # tar block: every header, and every member's data padded to a multiple
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def is_compressed(path: Path | str) -> bool:
    """Whether a shard is a gzip-compressed tar (by its name: ``.tar.gz`` / ``.tgz``)."""
    name = str(path)
    return name.endswith(".gz") or name.endswith(".tgz")


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


def _header_template() -> bytes:
    """The ustar header ``tarfile`` writes for a member with the shards' fixed metadata."""
    info = tarfile.TarInfo("x")
    info.size = 0
    info.mtime = 0
    info.mode = 0o644
    info.uname = info.gname = ""
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")


_TEMPLATE = _header_template()
_RECORD = tarfile.RECORDSIZE  # a tar ends with two zero blocks, padded to a whole record


class ShardWriter:
    """Writes one tar shard under a temporary name; :meth:`close` renames it into place.

    A reader (or a re-run of ``prepare``) therefore never sees a half-written shard under
    its final name.  Members are written with the same bytes :mod:`tarfile` would write (ustar,
    mode 0644, mtime 0, no owner names), but from a header template patched with the name, size
    and checksum, which is several times faster than ``TarFile.addfile`` per member.
    """

    def __init__(self, path: Path, dtype: str) -> None:
        self.path = Path(path)
        self.dtype = dtype
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self._raw: BinaryIO = open(self.tmp, "wb", buffering=1 << 20)  # noqa: SIM115
        self._gz: gzip.GzipFile | None = None
        self._out: BinaryIO = self._raw
        if is_compressed(self.path):
            # No file name and mtime 0 in the gzip header: the same samples give the same bytes.
            # Level 1: the tar's zero padding compresses as well as at level 6, 3x faster.
            self._gz = gzip.GzipFile(
                filename="", mode="wb", fileobj=self._raw, compresslevel=1, mtime=0
            )
            self._out = self._gz  # type: ignore[assignment]
        self._offset = 0
        self._pending: list[bytes] = []
        self.samples = 0

    def _add(self, name: str, data: bytes) -> None:
        encoded = name.encode("utf-8")
        size = len(data)
        if len(encoded) > 100 or size >= 8**11:  # never for prepare's keys: let tarfile do it
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = size, 0, 0o644
            info.uname = info.gname = ""
            header = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
        else:
            buf = bytearray(_TEMPLATE)
            buf[0:100] = encoded.ljust(100, b"\0")
            buf[124:136] = b"%011o\0" % size
            buf[148:156] = b"        "
            buf[148:155] = b"%06o\0" % sum(buf)
            header = bytes(buf)
        pad = -size % BLOCK
        self._pending += (header, data, bytes(pad)) if pad else (header, data)
        self._offset += len(header) + size + pad

    def write(self, key: str, src_ids: list[int], tgt_ids: list[int], src: str, tgt: str) -> None:
        """Append one sample (``src_ids`` already ends with EOS; ``tgt_ids`` has no BOS/EOS)."""
        self._add(f"{key}.src.ids", ids_to_bytes(src_ids, self.dtype))
        self._add(f"{key}.tgt.ids", ids_to_bytes(tgt_ids, self.dtype))
        self._add(f"{key}.src.txt", src.encode("utf-8"))
        self._add(f"{key}.tgt.txt", tgt.encode("utf-8"))
        self.samples += 1
        if len(self._pending) > 4096:
            self._flush()

    def _flush(self) -> None:
        self._out.write(b"".join(self._pending))
        self._pending = []

    def _finish_tar(self) -> None:
        """The end-of-archive marker as ``TarFile.close`` writes it."""
        end = 2 * BLOCK
        end += -(self._offset + end) % _RECORD
        self._pending.append(bytes(end))
        self._flush()

    def close(self) -> tuple[str, int]:
        """Finish the tar, fsync, rename into place; returns (sha256, bytes)."""
        self._finish_tar()
        self._close_streams()
        with open(self.tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(self.tmp, self.path)
        return sha256_file(self.path), self.path.stat().st_size

    def abort(self) -> None:
        """Drop the temporary file (on an error)."""
        try:
            self._close_streams()
        finally:
            self.tmp.unlink(missing_ok=True)

    def _close_streams(self) -> None:
        try:
            if self._gz is not None:
                self._gz.close()
        finally:
            self._raw.close()


@dataclass
class RawSample:
    """One sample as read from a shard: its index in the shard, key and member bytes."""

    index: int
    key: str
    parts: dict[str, bytes]


class ShardReadError(Exception):
    """The shard stopped being readable (tar error, missing file); ``read`` samples came first."""


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
        # The checksum counts its own 8-byte field as spaces (8 * 32 = 256).
        if stored != sum(header) - sum(header[148:156]) + 256:
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


def _open_shard(path: Path) -> BinaryIO:
    """A buffered binary stream of the tar bytes of a shard (decompressed for ``.gz``)."""
    if is_compressed(path):
        # Seeking forward (over skipped members) decompresses and discards: still sequential.
        # A small buffer: on damage, only the samples inside the failed read are lost.
        return io.BufferedReader(gzip.GzipFile(path, "rb"), buffer_size=1 << 16)  # type: ignore[arg-type]
    return open(path, "rb", buffering=1 << 20)


def iter_shard(path: Path, skip_before: int = 0, text: bool = True) -> Iterator[RawSample]:
    """Samples of a tar shard in file order, grouped by key (``RawSample.index`` counts them).

    Samples with ``index < skip_before`` come with empty ``parts``: their bytes are not read
    (resuming in the middle of a shard only reads headers up to there).  Raises
    :class:`ShardReadError` when the shard is missing or damaged part-way (the complete samples
    before the damage have been yielded; the one being read is lost).  A tar truncated exactly
    between members ends silently, which is why callers compare the count with the manifest.
    Without `text` the text members are seeked over, not read: such a sample's ``parts`` hold
    them as empty bytes (present, as a sample cut before them would not have them).
    """
    index = 0
    key: str | None = None
    parts: dict[str, bytes] = {}

    def want(name: str) -> bool:
        # The member belongs to sample `index`, or starts sample `index + 1`.
        if not text and name.endswith(TEXT_SUFFIX):
            return False
        k = name.rsplit("/", 1)[-1].split(".", 1)[0]
        return (index if k == key or key is None else index + 1) >= skip_before

    try:
        with _open_shard(Path(path)) as f:
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
                elif not text and ext.endswith(TEXT_SUFFIX) and index >= skip_before:
                    parts[ext] = b""  # there, not read
    except (OSError, ValueError, EOFError, zlib.error) as exc:  # EOFError: gzip cut short
        raise ShardReadError(f"{Path(path).name}: {exc}") from None
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
