"""The encoder processes of `prepare`: encode one chunk of pairs, clean it, write one shard."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_pipeline.packed import PackedWriter, packed_name
from data_pipeline.shards import ShardWriter
from data_pipeline.tokenizer import EOS_ID, Tokenizer

CLEAN_KEYS = ("empty", "too_long", "ratio", "duplicate")
ENCODE_BATCH = 4096  # pairs encoded at a time: ids as Python lists cost ~36 bytes per token

# The worker process's tokenizer, loaded once by the pool's initializer (a process global:
# each encoder process is started for this and holds nothing else).
_TOKENIZER: Tokenizer | None = None


def init_worker(spm_path: str) -> None:
    global _TOKENIZER
    _TOKENIZER = Tokenizer(spm_path)


def encoded(
    tok: Tokenizer, live: list[tuple[int, tuple[str, str]]]
) -> Iterator[tuple[tuple[int, tuple[str, str]], list[int], list[int]]]:
    """``(item, src ids, tgt ids)`` for each item of ``live``, encoded in slices so a worker
    never holds the ids of a whole shard."""
    for start in range(0, len(live), ENCODE_BATCH):
        part = live[start : start + ENCODE_BATCH]
        src_ids = tok.encode([p[0].strip() for _, p in part])
        tgt_ids = tok.encode([p[1].strip() for _, p in part])
        yield from zip(part, src_ids, tgt_ids, strict=True)


def encode_chunk(job: dict[str, Any]) -> dict[str, Any]:
    """Encode ``job["pairs"]`` (None marks a duplicate) and write the shard and its packed ids
    (data_pipeline/packed.py); returns its record.

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
    prefix = f"{job['split']}-{job['index']:06d}-"
    packed_as = packed_name(job["name"])
    packed_path = Path(job["out_path"]).with_name(Path(packed_as).name)  # beside the tar
    packed = PackedWriter(packed_path, job["dtype"], prefix)
    n_src = n_tgt = 0
    try:
        for (i, (src, tgt)), s, t in encoded(tok, live):
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
            writer.write(f"{prefix}{i:07d}", s, t, src, tgt)
            packed.write(i, s, t)
            n_src += len(s)
            n_tgt += len(t)
        sha, size = writer.close()
        packed_sha, packed_size = packed.close()
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
        "packed": {"name": packed_as, "sha256": packed_sha, "bytes": packed_size},
        "cleaning": counts,
    }
