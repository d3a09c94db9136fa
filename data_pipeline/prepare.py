"""Parallel text -> SentencePiece model + webdataset tar shards + manifest.

Input: a corpus directory (data_pipeline/inputs.py): ``train`` is required, ``valid``/``test``
are written when present.

Output in ``out_dir``: ``spm.model``/``spm.vocab`` (one model for both languages),
``shards/{split}-{i:06d}.tar`` (``.tar.gz`` with ``compress_shards``) and, written last and
atomically, ``manifest.json`` (format in :mod:`data_pipeline.manifest`).

Everything streams: the main process reads the inputs line by line, cuts them into chunks of
``shard_samples`` lines and hands each chunk to a worker process (data_pipeline/encode.py) that
encodes it and writes one shard (under a temporary name, renamed when complete).  At most
``2 * workers`` chunks are in flight, so memory does not grow with the corpus.  Each finished
shard is recorded in the resume journal (data_pipeline/journal.py); a re-run with the same
inputs and settings checks finished shards by sha256 and only does the rest.

Cleaning applies to the training split only (valid/test stay line-aligned with their
references): empty lines, pairs longer than ``max_len`` tokens on either side, pairs whose
token-length ratio exceeds ``max_ratio``, and optionally exact duplicates (``dedup``; this keeps
an 8-byte hash per training pair in memory).
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_pipeline.encode import CLEAN_KEYS, encode_chunk, init_worker
from data_pipeline.inputs import PairReader, resolve_inputs
from data_pipeline.journal import PROGRESS_NAME, append_record, load_progress, start_journal
from data_pipeline.manifest import (
    MANIFEST_NAME,
    MANIFEST_VERSION,
    TOKENIZER_NAME,
    write_json_atomic,
)
from data_pipeline.packed import SUFFIX as PACKED_SUFFIX
from data_pipeline.packed import pack_tar
from data_pipeline.progress import progress_bar
from data_pipeline.shards import dtype_for, sha256_file
from data_pipeline.shuffle import shuffled
from data_pipeline.spm_step import train_spm
from data_pipeline.tokenizer import Tokenizer
from data_pipeline.verify import file_problem, verify

__all__ = ["PROGRESS_NAME", "prepare", "verify"]

SPLITS = ("train", "valid", "test")
SHARD_DIR = "shards"


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


@dataclass(frozen=True)
class Settings:
    """Everything that decides what `prepare` writes (and so whether a re-run can reuse)."""

    vocab_size: int
    src_lang: str
    tgt_lang: str
    shard_samples: int
    max_len: int
    seed: int
    input_sentence_size: int
    model_type: str
    max_ratio: float | None
    dedup: bool
    compress_shards: bool
    shuffle: bool = True  # the training split in a global random order (data_pipeline/shuffle.py)

    def params(self, inputs: dict[str, list[Path]]) -> dict[str, Any]:
        """The journal's parameters line: these settings and the inputs' names and sizes."""
        return {
            **self.__dict__,
            "inputs": {s: [[f.name, f.stat().st_size] for f in fs] for s, fs in inputs.items()},
        }


def check_inputs(corpus_dir: Path, s: Settings, workers: int) -> dict[str, list[Path]]:
    """The input files of every split; one-line errors for what cannot be prepared."""
    if not corpus_dir.is_dir():
        raise FileNotFoundError(f"{corpus_dir}: corpus directory not found")
    if s.shard_samples <= 0 or s.vocab_size <= 4 or s.max_len <= 1 or workers < 0:
        raise ValueError(
            f"prepare: need shard_samples > 0, vocab_size > 4, max_len > 1, workers >= 0 "
            f"(got {s.shard_samples}, {s.vocab_size}, {s.max_len}, {workers})"
        )
    inputs = {split: resolve_inputs(corpus_dir, split, s.src_lang, s.tgt_lang) for split in SPLITS}
    if not inputs["train"]:
        raise ValueError(
            f"{corpus_dir}: no training data (train.{s.src_lang} + train.{s.tgt_lang}[.gz] "
            "or train.tsv[.gz])"
        )
    for files in inputs.values():
        for f in files:
            if f.stat().st_size == 0:
                raise ValueError(f"{f}: empty input file")
    return inputs


class OutDir:
    """The output directory and its journal: what can be reused, and starting over."""

    def __init__(self, out_dir: Path, params: dict[str, Any], log: Callable[[str], Any]) -> None:
        self.root = out_dir
        self.params = params
        self.shards = out_dir / SHARD_DIR
        self.journal = out_dir / PROGRESS_NAME
        self.tokenizer = out_dir / TOKENIZER_NAME
        out_dir.mkdir(parents=True, exist_ok=True)
        self.shards.mkdir(exist_ok=True)
        for tmp in self.shards.glob(".*.tmp-*"):
            tmp.unlink()
        self.records = load_progress(out_dir, params)
        if not self.records:
            if self.journal.exists() or any(self.shards.glob("*.tar*")):
                log(f"prepare: starting {out_dir} over (no matching earlier progress)")
            self.start_over()

    def start_over(self) -> None:
        for pattern in ("*.tar", "*.tar.gz", f"*{PACKED_SUFFIX}"):
            for old in self.shards.glob(pattern):
                old.unlink()
        (self.root / MANIFEST_NAME).unlink(missing_ok=True)
        start_journal(self.journal, self.params)

    def reusable(self, rid: str, name: str, dtype: str) -> dict[str, Any] | None:
        """The journal's record of piece `rid` when its file is still the one recorded; its
        packed ids are written again from it where they are missing or not the ones recorded
        (as in a data dir prepared before the packed store)."""
        rec = self.records.get(rid)
        path = self.root / name
        if not (rec and rec["name"] == name and path.is_file()):
            return None
        if sha256_file(path) != rec["sha256"]:
            return None
        rec = {k: v for k, v in rec.items() if k != "id"}
        packed = rec.get("packed")
        if packed is None or file_problem(self.root / packed["name"], packed):
            rec["packed"] = pack_tar(self.root, name, dtype)
            append_record(self.journal, {"id": rid, **rec})
        return rec


def ensure_tokenizer(
    out: OutDir, train_files: list[Path], s: Settings, workers: int, progress: bool | None,
    log: Callable[[str], Any],
) -> Tokenizer:  # fmt: skip
    """The shared sentencepiece model: reused when the journal vouches for it, else trained on
    a bounded sample of the training split (and every shard of an older model redone)."""
    spm_rec = out.records.get("spm")
    if spm_rec and out.tokenizer.is_file() and sha256_file(out.tokenizer) == spm_rec["sha256"]:
        log(f"prepare: reusing {out.tokenizer}")
        return Tokenizer(out.tokenizer)
    log(
        f"prepare: training sentencepiece ({s.model_type}, {s.vocab_size}) on up to "
        f"{s.input_sentence_size} sentences of the training split"
    )
    spm_args = {
        "files": [str(f) for f in train_files],
        "out_dir": str(out.root),
        "vocab_size": s.vocab_size,
        "model_type": s.model_type,
        "input_sentence_size": s.input_sentence_size,
        "seed": s.seed,
        "progress": progress,
    }
    if workers > 0:
        # In a child process: the sentence sample and sentencepiece's own memory (both grow
        # with the corpus up to input_sentence_size) go back to the OS when it exits, and
        # the encoder processes forked afterwards do not inherit them.
        with ProcessPoolExecutor(max_workers=1, mp_context=_mp_context()) as one:
            n, seconds = one.submit(train_spm, spm_args).result()
    else:
        n, seconds = train_spm(spm_args)
    log(f"prepare: sentencepiece trained on {n} sentences in {seconds:.1f}s")
    if out.records:  # shards encoded with an older model are invalid now
        out.start_over()
    out.records = {}
    append_record(out.journal, {"id": "spm", "sha256": sha256_file(out.tokenizer)})
    return Tokenizer(out.tokenizer)


def encoder_pool(spm_path: Path, workers: int) -> Any:
    """`workers` encoder processes, each holding the tokenizer; in-process for 0."""
    if workers == 0:
        init_worker(str(spm_path))
        return _InlinePool()
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=_mp_context(),
        initializer=init_worker,
        initargs=(str(spm_path),),
    )


def new_manifest(s: Settings, tok: Tokenizer, spm_path: Path) -> dict[str, Any]:
    """The manifest's head; `prepare` adds each split as it is written."""
    return {
        "version": MANIFEST_VERSION,
        "src_lang": s.src_lang,
        "tgt_lang": s.tgt_lang,
        "vocab_size": tok.vocab_size,
        "dtype": dtype_for(tok.vocab_size),
        "max_len": s.max_len,
        "spm_sha256": sha256_file(spm_path),
        "splits": {},
    }


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
    shuffle: bool = True,
) -> dict:
    """Build ``out_dir`` (tokenizer, shards, manifest) from ``corpus_dir``; returns the manifest.

    ``shard_samples`` input lines go into one shard (fewer after cleaning); ``workers``
    encoder processes (0 = encode in this process); ``max_len``/``max_ratio``/``dedup`` clean
    the training split; ``input_sentence_size`` bounds the sentences sentencepiece trains on;
    ``progress`` shows tqdm bars (default: when stderr is a TTY); ``compress_shards`` writes
    gzip-compressed tars (``.tar.gz``, about a tenth of the bytes for short sentences: the tar
    format costs ~4 KB per sample otherwise; the loader and webdataset read both); ``shuffle``
    puts the training pairs in a global random order from ``seed`` before sharding (a two-pass
    external shuffle through files in ``out_dir``, memory bounded).  Re-running
    after an interruption reuses every finished shard whose sha256 still matches.
    """
    s = Settings(
        vocab_size, src_lang, tgt_lang, shard_samples, max_len, seed, input_sentence_size,
        model_type, max_ratio, dedup, compress_shards, shuffle,
    )  # fmt: skip
    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    inputs = check_inputs(corpus_dir, s, workers)
    out = OutDir(out_dir, s.params(inputs), log)
    tok = ensure_tokenizer(out, inputs["train"], s, workers, progress, log)
    manifest = new_manifest(s, tok, out.tokenizer)
    pool = encoder_pool(out.tokenizer, workers)
    try:
        for split in SPLITS:
            if not inputs[split]:
                log(f"prepare: no {split} files in {corpus_dir}; skipping that split")
                continue
            writer = SplitWriter(split, out, pool, max(1, workers), s, manifest["dtype"])
            reader = PairReader(inputs[split], log)
            manifest["splits"][split] = writer.write(reader, progress, log)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    write_json_atomic(out_dir / MANIFEST_NAME, manifest)
    log(f"prepare: wrote {out_dir / MANIFEST_NAME}")
    return manifest


class SplitWriter:
    """Streams one split into shards: chunks to the encoder pool, records to the journal."""

    def __init__(
        self, split: str, out: OutDir, pool: Any, workers: int, s: Settings, dtype: str
    ) -> None:
        self.split, self.out, self.pool, self.workers = split, out, pool, workers
        self.shard_samples = s.shard_samples
        self.dedup = s.dedup and split == "train"
        self.shuffle_seed = s.seed if s.shuffle and split == "train" else None
        self.suffix = ".tar.gz" if s.compress_shards else ".tar"
        self.job_args = {
            "dtype": dtype,
            "clean": split == "train",
            "max_len": s.max_len,
            "max_ratio": s.max_ratio,
        }
        self.pending: deque[tuple[str, Future | dict]] = deque()
        self.done: list[dict] = []
        self.reused = 0

    def chunks(self, pairs: Iterator[tuple[str, str]]) -> Iterator[list[tuple[str, str] | None]]:
        """`shard_samples` pairs at a time; with dedup a repeated pair becomes None."""
        seen: set[bytes] = set()
        chunk: list[tuple[str, str] | None] = []
        for src, tgt in pairs:
            if self.dedup:
                h = hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest()
                chunk.append(None if h in seen else (src, tgt))
                seen.add(h)
            else:
                chunk.append((src, tgt))
            if len(chunk) == self.shard_samples:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def submit(self, index: int, chunk: list[tuple[str, str] | None]) -> None:
        """Encode shard `index` (or reuse it), then wait while too many are in flight."""
        name = f"{SHARD_DIR}/{self.split}-{index:06d}{self.suffix}"
        rid = f"{self.split}/{index}"
        reused = self.out.reusable(rid, name, self.job_args["dtype"])
        if reused is not None:
            self.reused += 1
            self.pending.append((rid, reused))
        else:
            job = {**self.job_args, "split": self.split, "index": index, "name": name}
            job |= {"pairs": chunk, "out_path": str(self.out.root / name)}
            self.pending.append((rid, self.pool.submit(encode_chunk, job)))
        self.collect(2 * self.workers)

    def collect(self, limit: int) -> None:
        while len(self.pending) > limit:
            rid, item = self.pending.popleft()
            rec = item if isinstance(item, dict) else item.result()
            if isinstance(item, Future):
                append_record(self.out.journal, {"id": rid, **rec})
            self.done.append(rec)

    def write(
        self, reader: PairReader, progress: bool | None, log: Callable[[str], Any]
    ) -> dict[str, Any]:
        """Stream the split into shards; returns its manifest entry."""
        bar = progress_bar(progress, reader.total_bytes, self.split)
        last_pos = 0
        pairs: Iterator[tuple[str, str]] = iter(reader)
        if self.shuffle_seed is not None:
            work = self.out.root / f".shuffle-{self.split}"
            pairs = shuffled(pairs, work, self.shuffle_seed, reader.text_bytes())
        try:
            for index, chunk in enumerate(self.chunks(pairs)):
                self.submit(index, chunk)
                bar.update(reader.raw_pos - last_pos)
                last_pos = reader.raw_pos
            self.collect(0)
        finally:
            bar.close()
        return self.entry(log)

    def entry(self, log: Callable[[str], Any]) -> dict[str, Any]:
        done = self.done
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
            f"prepare: {self.split}: {entry['samples']} pairs of {cleaning['lines']} lines in "
            f"{len(done)} shards ({self.reused} verified from an earlier run)"
            + (", globally shuffled" if self.shuffle_seed is not None else "")
            + (f"; dropped {dropped}" if dropped else "")
        )
        return entry
