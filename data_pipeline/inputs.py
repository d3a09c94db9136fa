"""Reading a corpus directory's parallel text, pair by pair, with one-line errors.

A split is line-aligned UTF-8 files ``{split}.{lang}`` (``train.en``, ``train.de``, ...),
each optionally gzipped (``train.en.gz``), or one tab-separated file ``{split}.tsv`` /
``{split}.tsv.gz`` (column 1 = source, column 2 = target; further columns, such as a score or
an origin, are ignored, and one line says so).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


class _LineFile:
    """Binary line reader over a plain or gzipped file that knows how far into the file it is.

    ``raw_pos`` is the offset in the file on disk (compressed bytes for ``.gz``), which is what
    a progress bar with an ETA needs.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._raw: BinaryIO = open(path, "rb")  # noqa: SIM115 (closed in close())
        self._f: BinaryIO = (
            gzip.GzipFile(fileobj=self._raw) if path.name.endswith(".gz") else self._raw
        )

    @property
    def raw_pos(self) -> int:
        return self.path.stat().st_size if self._raw.closed else self._raw.tell()

    def readline(self) -> bytes:
        try:
            return self._f.readline()
        except (OSError, EOFError) as exc:  # damaged gzip stream
            raise ValueError(f"{self.path}: cannot read ({exc})") from None

    def close(self) -> None:
        if self._f is not self._raw:
            self._f.close()
        self._raw.close()


def _decode(line: bytes, path: Path, lineno: int) -> str:
    """UTF-8 text of one line without its line ending; one-line error naming file and line."""
    try:
        return line.rstrip(b"\r\n").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}:{lineno}: invalid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


def _find(corpus_dir: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (corpus_dir / name).is_file():
            return corpus_dir / name
    return None


def resolve_inputs(corpus_dir: Path, split: str, src_lang: str, tgt_lang: str) -> list[Path]:
    """Input files of a split: ``[src, tgt]`` (parallel files), ``[tsv]``, or ``[]`` if absent."""
    src = _find(corpus_dir, f"{split}.{src_lang}")
    tgt = _find(corpus_dir, f"{split}.{tgt_lang}")
    if src and tgt:
        return [src, tgt]
    if src or tgt:
        have, miss = (src, f"{split}.{tgt_lang}") if src else (tgt, f"{split}.{src_lang}")
        raise ValueError(f"{have}: its parallel file {corpus_dir / miss}[.gz] is missing")
    tsv = _find(corpus_dir, f"{split}.tsv")
    return [tsv] if tsv else []


class PairReader:
    """Iterates ``(src, tgt)`` text pairs of one split, validating as it goes.

    Raises one-line ``ValueError``s naming the file (and line) for: an empty file, parallel
    files of different lengths, invalid UTF-8, a TSV line with fewer than two columns. A TSV
    with more columns gives its first two; `log` says so once.
    """

    def __init__(self, files: list[Path], log: Callable[[str], object] = print) -> None:
        self.files = files
        self.total_bytes = sum(f.stat().st_size for f in files)
        self.log = log
        self._handles: list[_LineFile] = []

    def text_bytes(self) -> int:
        """About the text's size: the files' sizes, a gzipped one counted 4x."""
        return sum(f.stat().st_size * (4 if f.name.endswith(".gz") else 1) for f in self.files)

    @property
    def raw_pos(self) -> int:
        return sum(h.raw_pos for h in self._handles)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        self._handles = [_LineFile(f) for f in self.files]
        try:
            if len(self._handles) == 2:
                yield from self._parallel(*self._handles)
            else:
                yield from self._tsv(self._handles[0])
        finally:
            for h in self._handles:
                h.close()

    def _parallel(self, a: _LineFile, b: _LineFile) -> Iterator[tuple[str, str]]:
        lineno = 0
        while True:
            la, lb = a.readline(), b.readline()
            if not la and not lb:
                break
            lineno += 1
            if not la or not lb:
                short, longer = (a, b) if not la else (b, a)
                raise ValueError(
                    f"{short.path} has {lineno - 1} lines but {longer.path} has more "
                    "(parallel files must be line-aligned)"
                )
            yield _decode(la, a.path, lineno), _decode(lb, b.path, lineno)
        if lineno == 0:
            raise ValueError(f"{a.path}: empty input file")

    def _tsv(self, f: _LineFile) -> Iterator[tuple[str, str]]:
        lineno, widest = 0, 2
        while line := f.readline():
            lineno += 1
            cols = _decode(line, f.path, lineno).split("\t")
            if len(cols) < 2:
                raise ValueError(
                    f"{f.path}:{lineno}: expected at least 2 tab-separated columns (source, "
                    f"target), found {len(cols)}"
                )
            if len(cols) > widest:
                if widest == 2:
                    self.log(
                        f"prepare: {f.path.name} has {len(cols)} tab-separated columns (line "
                        f"{lineno}); using the first two as source and target"
                    )
                widest = len(cols)
            yield cols[0], cols[1]
        if lineno == 0:
            raise ValueError(f"{f.path}: empty input file")
