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
    pad_multiple: int = 8
    shuffle_buffer: int = 2000
    bucket_width: int = 8  # length buckets of this many tokens
    num_workers: int = 1  # loader worker processes per rank
    seed: int = 1

    def problems(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not isinstance(self.dir, str) or not self.dir:
            out.append(("dir", "must be a path"))
        for key in ("vocab_size", "max_tokens", "max_len", "pad_multiple", "bucket_width"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                out.append((key, f"must be a positive integer, got {value!r}"))
        for key in ("shuffle_buffer", "num_workers"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                out.append((key, f"must be a non-negative integer, got {value!r}"))
        if not out and self.max_tokens < self.max_len:
            out.append(("max_tokens", f"{self.max_tokens} is below max_len={self.max_len}"))
        return out
