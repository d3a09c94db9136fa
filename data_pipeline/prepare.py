"""Parallel text -> SentencePiece model + webdataset tar shards + manifest.

Input: a corpus directory with line-aligned UTF-8 files ``{split}.{lang}`` (``train.en``,
``train.de``, ...), each optionally gzipped (``train.en.gz``), or one tab-separated file per
split, ``{split}.tsv`` / ``{split}.tsv.gz`` (column 1 = source, column 2 = target).  ``train``
is required; ``valid``/``test`` are written when present.

Output in ``out_dir``: ``spm.model``/``spm.vocab`` (one model for both languages),
``shards/{split}-{i:06d}.tar`` (``.tar.gz`` with ``compress_shards``) and, written last and
atomically, ``manifest.json`` (format in :mod:`data_pipeline.manifest`).

Everything streams: the main process reads the inputs line by line, cuts them into chunks of
``shard_samples`` lines and hands each chunk to a worker process that encodes it and writes
one shard (under a temporary name, renamed when complete).  At most ``2 * workers`` chunks are
in flight, so memory does not grow with the corpus.  Each finished shard is recorded in
``.prepare-progress.jsonl``; a re-run with the same inputs and settings checks finished shards
by sha256 and only does the rest.

Cleaning applies to the training split only (valid/test stay line-aligned with their
references): empty lines, pairs longer than ``max_len`` tokens on either side, pairs whose
token-length ratio exceeds ``max_ratio``, and optionally exact duplicates (``dedup``; this keeps
an 8-byte hash per training pair in memory).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import multiprocessing as mp
import os
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from data_pipeline.manifest import MANIFEST_NAME, MANIFEST_VERSION, write_json_atomic
from data_pipeline.shards import ShardWriter, dtype_for, sha256_file
from data_pipeline.tokenizer import EOS_ID, Tokenizer, train_sentencepiece

SPLITS = ("train", "valid", "test")
PROGRESS_NAME = ".prepare-progress.jsonl"
CLEAN_KEYS = ("empty", "too_long", "ratio", "duplicate")


# --------------------------------------------------------------------------------------------
# Reading the inputs


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
    files of different lengths, invalid UTF-8, a TSV line without exactly two columns.
    """

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.total_bytes = sum(f.stat().st_size for f in files)
        self._handles: list[_LineFile] = []

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
        lineno = 0
        while line := f.readline():
            lineno += 1
            cols = _decode(line, f.path, lineno).split("\t")
            if len(cols) != 2:
                raise ValueError(
                    f"{f.path}:{lineno}: expected 2 tab-separated columns, found {len(cols)}"
                )
            yield cols[0], cols[1]
        if lineno == 0:
            raise ValueError(f"{f.path}: empty input file")


# --------------------------------------------------------------------------------------------
# Worker side: encode one chunk, write one shard

_TOKENIZER: Tokenizer | None = None


def _init_worker(spm_path: str) -> None:
    global _TOKENIZER
    _TOKENIZER = Tokenizer(spm_path)


ENCODE_BATCH = 4096  # pairs encoded at a time: ids as Python lists cost ~36 bytes per token


def _encoded(
    tok: Tokenizer, live: list[tuple[int, tuple[str, str]]]
) -> Iterator[tuple[tuple[int, tuple[str, str]], list[int], list[int]]]:
    """``(item, src ids, tgt ids)`` for each item of ``live``, encoded in slices so a worker
    never holds the ids of a whole shard."""
    for start in range(0, len(live), ENCODE_BATCH):
        part = live[start : start + ENCODE_BATCH]
        src_ids = tok.encode([p[0].strip() for _, p in part])
        tgt_ids = tok.encode([p[1].strip() for _, p in part])
        yield from zip(part, src_ids, tgt_ids, strict=True)


def _encode_chunk(job: dict[str, Any]) -> dict[str, Any]:
    """Encode ``job["pairs"]`` (None marks a duplicate) and write the shard; returns its record.

    Keys are ``{split}-{shard:06d}-{offset:07d}`` with the line offset inside the chunk, so a
    key points back to its input line: ``shard * shard_samples + offset + 1``.
    """
    assert _TOKENIZER is not None, "worker not initialised"
    tok = _TOKENIZER
    pairs: list[tuple[str, str] | None] = job["pairs"]
    clean: bool = job["clean"]
    max_len: int = job["max_len"]
    max_ratio: float | None = job["max_ratio"]
    counts = dict.fromkeys(CLEAN_KEYS, 0)
    counts["lines"] = len(pairs)
    live = [(i, p) for i, p in enumerate(pairs) if p is not None]
    counts["duplicate"] = len(pairs) - len(live)
    if clean:
        kept = [(i, p) for i, p in live if p[0].strip() and p[1].strip()]
        counts["empty"] = len(live) - len(kept)
        live = kept
    writer = ShardWriter(Path(job["out_path"]), job["dtype"])
    n_src = n_tgt = 0
    try:
        for (i, (src, tgt)), s, t in _encoded(tok, live):
            if clean:
                # Lengths as the loader sees them: src + EOS, and BOS/EOS + tgt.
                if len(s) + 1 > max_len or len(t) + 1 > max_len:
                    counts["too_long"] += 1
                    continue
                if max_ratio is not None and max(len(s) + 1, len(t) + 1) > max_ratio * min(
                    len(s) + 1, len(t) + 1
                ):
                    counts["ratio"] += 1
                    continue
            s = [*s, EOS_ID]
            writer.write(f"{job['split']}-{job['index']:06d}-{i:07d}", s, t, src, tgt)
            n_src += len(s)
            n_tgt += len(t)
        sha, size = writer.close()
    except BaseException:
        writer.abort()
        raise
    return {
        "name": job["name"],
        "samples": writer.samples,
        "src_tokens": n_src,
        "tgt_tokens": n_tgt,
        "sha256": sha,
        "bytes": size,
        "cleaning": counts,
    }


# --------------------------------------------------------------------------------------------
# Main process


class _InlinePool:
    """Stand-in for a process pool when ``workers == 0`` (debugging, tiny corpora)."""

    def submit(self, fn: Callable, job: dict) -> Future:
        fut: Future = Future()
        fut.set_result(fn(job))
        return fut

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def _mp_context() -> Any:
    """``fork`` where available: cheap, and the workers need nothing but the spm path."""
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


def _progress_bar(enabled: bool | None, total: int, desc: str) -> Any:
    """A tqdm bar over input bytes (ETA included) on a TTY; a no-op object otherwise."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        enabled = False
    if not enabled:

        class _Null:
            def update(self, n: int) -> None:
                pass

            def close(self) -> None:
                pass

        return _Null()
    # No monitor thread: encoder processes are forked later, and forking with threads is unsafe.
    tqdm.monitor_interval = 0
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, dynamic_ncols=True)


def _sample_for_spm(
    reader: PairReader, size: int, seed: int, path: Path, progress: bool | None
) -> int:
    """Reservoir-sample ``size`` non-empty sentences (both sides) of the training pairs.

    Bounded memory however large the corpus; the sample is written to ``path`` for
    sentencepiece.  Returns the number of sentences written.
    """
    rng = random.Random(seed)
    reservoir: list[str] = []
    seen = 0
    bar = _progress_bar(progress, reader.total_bytes, "spm sample")
    last = 0
    try:
        for n, (src, tgt) in enumerate(reader):
            for text in (src.strip(), tgt.strip()):
                if not text:
                    continue
                seen += 1
                if len(reservoir) < size:
                    reservoir.append(text)
                else:
                    j = rng.randrange(seen)
                    if j < size:
                        reservoir[j] = text
            if n % 4096 == 0:
                pos = reader.raw_pos
                bar.update(pos - last)
                last = pos
    finally:
        bar.close()
    if not reservoir:
        raise ValueError(f"{reader.files[0]}: no non-empty training sentences")
    with open(path, "w", encoding="utf-8") as f:
        for text in reservoir:
            f.write(text.replace("\n", " ") + "\n")
    return len(reservoir)


def _train_spm(a: dict[str, Any]) -> tuple[int, float]:
    """Sample the training sentences and train ``out_dir/spm.model``; (sentences, seconds)."""
    started = time.monotonic()
    out_dir = Path(a["out_dir"])
    sample_path = out_dir / ".spm-sample.txt"
    try:
        n = _sample_for_spm(
            PairReader([Path(f) for f in a["files"]]),
            a["input_sentence_size"],
            a["seed"],
            sample_path,
            a["progress"],
        )
        train_sentencepiece(
            [sample_path],
            out_dir / "spm",
            a["vocab_size"],
            model_type=a["model_type"],
            input_sentence_size=a["input_sentence_size"],
            seed=a["seed"],
        )
    finally:
        sample_path.unlink(missing_ok=True)
    return n, time.monotonic() - started


def _load_progress(out_dir: Path, params: dict) -> dict[str, dict]:
    """Records of the previous run with identical params (else start over: ``{}``)."""
    path = out_dir / PROGRESS_NAME
    records: dict[str, dict] = {}
    if not path.is_file():
        return records
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    try:
        head = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        head = None
    if head != {"kind": "params", **params}:
        return {}
    for line in lines[1:]:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break  # a torn last line from the interruption
        records[rec["id"]] = rec
    return records


def _append(path: Path, rec: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def prepare(
    corpus_dir: Path,
    out_dir: Path,
    *,
    vocab_size: int,
    src_lang: str = "en",
    tgt_lang: str = "de",
    shard_samples: int = 100_000,
    workers: int = 2,
    max_len: int = 256,
    seed: int = 1,
    log: Callable[[str], Any] = print,
    input_sentence_size: int = 2_000_000,
    model_type: str = "bpe",
    max_ratio: float | None = 3.0,
    dedup: bool = False,
    progress: bool | None = None,
    compress_shards: bool = False,
) -> dict:
    """Build ``out_dir`` (tokenizer, shards, manifest) from ``corpus_dir``; returns the manifest.

    ``shard_samples`` input lines go into one shard (fewer after cleaning); ``workers``
    encoder processes (0 = encode in this process); ``max_len``/``max_ratio``/``dedup`` clean
    the training split; ``input_sentence_size`` bounds the sentences sentencepiece trains on;
    ``progress`` shows tqdm bars (default: when stderr is a TTY); ``compress_shards`` writes
    gzip-compressed tars (``.tar.gz``, about a tenth of the bytes for short sentences: the tar
    format costs ~4 KB per sample otherwise; the loader and webdataset read both).  Re-running
    after an interruption reuses every finished shard whose sha256 still matches.
    """
    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    if not corpus_dir.is_dir():
        raise FileNotFoundError(f"{corpus_dir}: corpus directory not found")
    if shard_samples <= 0 or vocab_size <= 4 or max_len <= 1 or workers < 0:
        raise ValueError(
            f"prepare: need shard_samples > 0, vocab_size > 4, max_len > 1, workers >= 0 "
            f"(got {shard_samples}, {vocab_size}, {max_len}, {workers})"
        )
    inputs = {s: resolve_inputs(corpus_dir, s, src_lang, tgt_lang) for s in SPLITS}
    if not inputs["train"]:
        raise ValueError(
            f"{corpus_dir}: no training data (train.{src_lang} + train.{tgt_lang}[.gz] "
            "or train.tsv[.gz])"
        )
    for files in inputs.values():
        for f in files:
            if f.stat().st_size == 0:
                raise ValueError(f"{f}: empty input file")
    params = {
        "vocab_size": vocab_size,
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "shard_samples": shard_samples,
        "max_len": max_len,
        "seed": seed,
        "input_sentence_size": input_sentence_size,
        "model_type": model_type,
        "max_ratio": max_ratio,
        "dedup": dedup,
        "compress_shards": compress_shards,
        "inputs": {s: [[f.name, f.stat().st_size] for f in fs] for s, fs in inputs.items()},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    shard_dir = out_dir / "shards"
    shard_dir.mkdir(exist_ok=True)
    for tmp in shard_dir.glob(".*.tmp-*"):
        tmp.unlink()
    progress_path = out_dir / PROGRESS_NAME
    records = _load_progress(out_dir, params)

    def start_over() -> None:
        for pattern in ("*.tar", "*.tar.gz"):
            for old in shard_dir.glob(pattern):
                old.unlink()
        (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
        with open(progress_path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"kind": "params", **params}) + "\n")

    if not records:
        if progress_path.exists() or any(shard_dir.glob("*.tar*")):
            log(f"prepare: starting {out_dir} over (no matching earlier progress)")
        start_over()

    # 1. Tokenizer (shared by both languages), trained on a bounded sample of the train split.
    spm_path = out_dir / "spm.model"
    spm_rec = records.get("spm")
    if spm_rec and spm_path.is_file() and sha256_file(spm_path) == spm_rec["sha256"]:
        log(f"prepare: reusing {spm_path}")
    else:
        log(
            f"prepare: training sentencepiece ({model_type}, {vocab_size}) on up to "
            f"{input_sentence_size} sentences of the training split"
        )
        spm_args = {
            "files": [str(f) for f in inputs["train"]],
            "out_dir": str(out_dir),
            "vocab_size": vocab_size,
            "model_type": model_type,
            "input_sentence_size": input_sentence_size,
            "seed": seed,
            "progress": progress,
        }
        if workers > 0:
            # In a child process: the sentence sample and sentencepiece's own memory (both grow
            # with the corpus up to input_sentence_size) go back to the OS when it exits, and
            # the encoder processes forked afterwards do not inherit them.
            with ProcessPoolExecutor(max_workers=1, mp_context=_mp_context()) as one:
                n, seconds = one.submit(_train_spm, spm_args).result()
        else:
            n, seconds = _train_spm(spm_args)
        log(f"prepare: sentencepiece trained on {n} sentences in {seconds:.1f}s")
        # Shards encoded with an older model are invalid now.
        if records:
            start_over()
        records = {}
        _append(progress_path, {"id": "spm", "sha256": sha256_file(spm_path)})
    tok = Tokenizer(spm_path)
    dtype = dtype_for(tok.vocab_size)

    # 2. Shards, split by split, chunk by chunk, in worker processes.
    manifest: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "vocab_size": tok.vocab_size,
        "dtype": dtype,
        "max_len": max_len,
        "spm_sha256": sha256_file(spm_path),
        "splits": {},
    }
    pool: Any = (
        ProcessPoolExecutor(
            max_workers=workers,
            mp_context=_mp_context(),
            initializer=_init_worker,
            initargs=(str(spm_path),),
        )
        if workers > 0
        else _InlinePool()
    )
    if workers == 0:
        _init_worker(str(spm_path))
    try:
        for split in SPLITS:
            if not inputs[split]:
                log(f"prepare: no {split} files in {corpus_dir}; skipping that split")
                continue
            manifest["splits"][split] = _write_split(
                split,
                PairReader(inputs[split]),
                out_dir,
                records,
                pool,
                max(1, workers),
                {
                    "dtype": dtype,
                    "suffix": ".tar.gz" if compress_shards else ".tar",
                    "clean": split == "train",
                    "max_len": max_len,
                    "max_ratio": max_ratio,
                },
                shard_samples,
                dedup and split == "train",
                progress_path,
                progress,
                log,
            )
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    write_json_atomic(out_dir / MANIFEST_NAME, manifest)
    log(f"prepare: wrote {out_dir / MANIFEST_NAME}")
    return manifest


def verify(data_dir: Path, log: Callable[[str], Any] = print) -> list[str]:
    """Check every shard of ``data_dir``'s manifest against its size and sha256.

    Returns the names of missing or damaged shards (empty: all good), logging one line each.
    The loader does not hash shards (too slow per epoch); run this after copying a data
    directory, or let ``prepare`` re-run, which redoes exactly those shards.
    """
    from data_pipeline.manifest import read_manifest

    data_dir = Path(data_dir)
    bad: list[str] = []
    for split in read_manifest(data_dir)["splits"].values():
        for shard in split["shards"]:
            path = data_dir / shard["name"]
            if not path.is_file():
                problem = "missing"
            elif path.stat().st_size != shard["bytes"]:
                problem = f"{path.stat().st_size} bytes, manifest says {shard['bytes']}"
            elif sha256_file(path) != shard["sha256"]:
                problem = "sha256 mismatch"
            else:
                continue
            bad.append(shard["name"])
            log(f"verify: {path}: {problem}")
    return bad


def _write_split(
    split: str,
    reader: PairReader,
    out_dir: Path,
    records: dict[str, dict],
    pool: Any,
    workers: int,
    job_args: dict[str, Any],
    shard_samples: int,
    dedup: bool,
    progress_path: Path,
    progress: bool | None,
    log: Callable[[str], Any],
) -> dict[str, Any]:
    """Stream one split into shards; returns its manifest entry."""
    pending: deque[tuple[str, Future | dict]] = deque()
    done: list[dict] = []
    seen_hashes: set[bytes] = set()
    reused = 0
    bar = _progress_bar(progress, reader.total_bytes, split)
    last_pos = 0

    def collect(limit: int) -> None:
        while len(pending) > limit:
            rid, item = pending.popleft()
            rec = item if isinstance(item, dict) else item.result()
            if isinstance(item, Future):
                _append(progress_path, {"id": rid, **rec})
            done.append(rec)

    def flush(index: int, chunk: list[tuple[str, str] | None]) -> None:
        nonlocal reused, last_pos
        name = f"shards/{split}-{index:06d}{job_args['suffix']}"
        rid = f"{split}/{index}"
        rec = records.get(rid)
        path = out_dir / name
        if rec and rec["name"] == name and path.is_file() and sha256_file(path) == rec["sha256"]:
            reused += 1
            pending.append((rid, {k: v for k, v in rec.items() if k != "id"}))
        else:
            job = {**job_args, "split": split, "index": index, "name": name, "pairs": chunk}
            job["out_path"] = str(path)
            pending.append((rid, pool.submit(_encode_chunk, job)))
        collect(2 * workers)
        pos = reader.raw_pos
        bar.update(pos - last_pos)
        last_pos = pos

    chunk: list[tuple[str, str] | None] = []
    index = 0
    try:
        for src, tgt in reader:
            if dedup:
                h = hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest()
                if h in seen_hashes:
                    chunk.append(None)
                else:
                    seen_hashes.add(h)
                    chunk.append((src, tgt))
            else:
                chunk.append((src, tgt))
            if len(chunk) == shard_samples:
                flush(index, chunk)
                chunk, index = [], index + 1
        if chunk:
            flush(index, chunk)
        collect(0)
    finally:
        bar.close()
    cleaning = {k: sum(r["cleaning"][k] for r in done) for k in ("lines", *CLEAN_KEYS)}
    entry = {
        "samples": sum(r["samples"] for r in done),
        "src_tokens": sum(r["src_tokens"] for r in done),
        "tgt_tokens": sum(r["tgt_tokens"] for r in done),
        "cleaning": cleaning,
        "shards": [{k: v for k, v in r.items() if k != "cleaning"} for r in done],
    }
    dropped = ", ".join(f"{k} {cleaning[k]}" for k in CLEAN_KEYS if cleaning[k])
    log(
        f"prepare: {split}: {entry['samples']} pairs of {cleaning['lines']} lines in "
        f"{len(done)} shards ({reused} verified from an earlier run)"
        + (f"; dropped {dropped}" if dropped else "")
    )
    return entry
