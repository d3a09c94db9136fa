"""Settings of the training-time data stream (`prepare` describes its output in the manifest)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    """Where the prepared shards live and how they are batched."""

    dir: str = "data"  # output of `paperscale prepare`: manifest.json, spm.model, shards/
    vocab_size: int = 37000  # tokenizer size `prepare` trains by default for this config
    max_tokens: int = 4096  # padded tokens per micro-batch and side: B * max(S, T) <= max_tokens
    max_len: int = 256  # longer training pairs (either side, in tokens) are skipped and counted
    pad_multiple: int = 1  # round each batch's lengths up to this (8 costs ~17% on short text)
    batch_multiple: int = 8  # rows per batch cut to a multiple of this: B * T % 8 == 0
    shuffle_buffer: int = 100_000  # samples per window (bucketing + shuffle); ~1 KB each
    bucket_width: int = 1  # length buckets of this many tokens (1 = sort by exact lengths)
    num_workers: int = 1  # loader worker processes per rank
    # shuffle windows each worker reads, decodes and cuts ahead (a thread) while it hands out
    # the current one's batches; 0: each window when its turn comes (the consumer waits then)
    read_ahead: int = 1
    seed: int = 1  # shuffle and dealing order of the training stream

    def problems(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not isinstance(self.dir, str) or not self.dir:
            out.append(("dir", "must be a path"))
        for key in (
            "vocab_size", "max_tokens", "max_len", "pad_multiple", "batch_multiple", "bucket_width",
        ):  # fmt: skip
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                out.append((key, f"must be a positive integer, got {value!r}"))
        for key in ("shuffle_buffer", "num_workers", "read_ahead"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                out.append((key, f"must be a non-negative integer, got {value!r}"))
        if not out and self.max_tokens < self.max_len:
            out.append(("max_tokens", f"{self.max_tokens} is below max_len={self.max_len}"))
        return out
