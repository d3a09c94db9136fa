"""Settings of the training-time data stream (`prepare` describes its output in the manifest)."""

from __future__ import annotations

import os
from dataclasses import dataclass

GPU_WORKERS_MAX = 2  # loader workers per rank `auto` gives a GPU rank with cores to spare
STORES = ("auto", "packed", "tar")  # data.store
PACKED_MISSING = (
    "packed, but the manifest lists no packed ids for these shards (re-run `paperscale "
    "prepare` on the same corpus and data dir to add them)"
)


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
    # loader worker processes per rank; auto: 1 on a CPU, up to 2 on a GPU from the cores per
    # rank (docs/decisions.md)
    num_workers: int | str = "auto"
    # shuffle windows each worker reads, decodes and cuts ahead (a thread) while it hands out
    # the current one's batches; 0: each window when its turn comes (the consumer waits then)
    read_ahead: int = 1
    # batches the rank receives from its workers ahead of the trainer, in a thread (taking a
    # batch off the workers' queue and unpickling it, ~0.5 ms, overlaps the step); 0: received
    # when the trainer asks for it
    prefetch: int = 4
    # what training batches are read from: auto (the packed ids `prepare` writes beside each
    # shard, where the manifest lists them; else the tar shards), packed or tar; text for BLEU
    # and `translate` always comes from the tar shards
    store: str = "auto"
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
        for key in ("shuffle_buffer", "num_workers", "read_ahead", "prefetch"):
            value = getattr(self, key)
            if key == "num_workers" and value == "auto":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                out.append((key, f"must be a non-negative integer, got {value!r}"))
        if self.store not in STORES:
            out.append(("store", f"must be one of {', '.join(STORES)}, got {self.store!r}"))
        if not out and self.max_tokens < self.max_len:
            out.append(("max_tokens", f"{self.max_tokens} is below max_len={self.max_len}"))
        return out


def workers_for(device_type: str, cores: int, local_ranks: int) -> tuple[int, str]:
    """`data.num_workers: auto`: (workers per rank, the reason in a few words).

    On a CPU one: the ranks compute on the cores, and one worker delivers over a million tokens
    per second (bench data), hundreds of times what a CPU step takes, reading its next window
    ahead. On a GPU each rank keeps one core to drive its device and gets one worker per spare
    core, at most GPU_WORKERS_MAX: two windows in flight where a compiled step takes ~0.5-0.7M
    tokens/s (bench feed plays one), and at least one."""
    if device_type != "cuda":
        return 1, "a CPU: one worker per rank reads ahead while the rank computes"
    per_rank = max(1, cores // max(1, local_ranks))
    n = min(GPU_WORKERS_MAX, max(1, per_rank - 1))
    return n, (
        f"{cores} cores for {local_ranks} GPU ranks on this node: {per_rank} per rank, one "
        f"to drive its GPU, {n} for loader workers (at most {GPU_WORKERS_MAX})"
    )


def host_workers(device_type: str) -> tuple[int, str]:
    """workers_for on this host: the cores this process may run on, and the ranks on its node
    (torchrun's LOCAL_WORLD_SIZE; 1 outside a launched job)."""
    cores = len(os.sched_getaffinity(0))
    return workers_for(device_type, cores, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def resolved_workers(value: int | str) -> int:
    """`data.num_workers` as a number: an `auto` outside a training run's decisions (evaluate,
    translate, benches) is decided here, for the device torch sees."""
    if value != "auto":
        return int(value)
    import torch

    return host_workers("cuda" if torch.cuda.is_available() else "cpu")[0]


def resolved_store(store: str, shards: list[dict], text: bool) -> str:
    """`data.store` for a stream over `shards` (manifest entries): "packed" or "tar". Batches
    with text read the tar shards, the text's only copy; `auto` reads the packed ids where
    every shard has them. ValueError for `packed` on shards without them."""
    if store == "packed" and not has_packed(shards):
        raise ValueError(f"data.store: {PACKED_MISSING}")
    return "packed" if store != "tar" and has_packed(shards) and not text else "tar"


def has_packed(shards: list[dict]) -> bool:
    """Whether every shard (manifest entries) has its packed ids."""
    return all("packed" in s for s in shards)
