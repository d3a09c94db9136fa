"""The plan's data line: what the loader delivers to a rank against what its step takes.

The step takes the tokens of its micro-batches (source and target sides, padding included: an
upper bound on the real tokens) each step time; one loader worker delivers WORKER_TOKENS_PER_S
real tokens per second from the store it reads (measured over many shuffle windows on the
machine FEED_SOURCE names; a GPU host's cores are usually faster). Past FEED_SHARE of what
the workers deliver, the plan warns: a step that waits for data is GPU time lost.
"""

from __future__ import annotations

from typing import Any

# one worker on a core of its own, its rank taking batches as fast as they come, for 30 s of an
# endless stream (many shuffle windows read, not only the first one handed out): bench data's
# `loader, tar, <store> store, 1 workers` rows on debian-ende at 4,096-token batches. Per
# data.store: the packed ids (what `auto` reads where prepare wrote them) and the tar shards.
WORKER_TOKENS_PER_S = {"packed": 7.03e6, "tar": 0.39e6}
FEED_SOURCE = "one worker, 30 s of windows, on a 2-core AMD EPYC, AVX2, 2026-12-06"
FEED_SHARE = 0.5  # the share of the workers' rate past which the plan warns


def planned_workers(num_workers: int | str, on_gpu: bool) -> tuple[int, str]:
    """The workers per rank the plan prices, and how it came to them: a number as set; `auto`
    at its least on a GPU (1; 2 where the node has a core per rank to spare beyond one), 1 on a
    CPU (data_pipeline/config.py's workers_for)."""
    if num_workers != "auto":
        n = int(num_workers)
        return n, f"data.num_workers={n}" + (" (the rank reads itself)" if n == 0 else "")
    if on_gpu:
        return 1, "data.num_workers=auto: 1-2 per rank by the node's cores, priced at 1"
    return 1, "data.num_workers=auto: 1 on a CPU"


def feed_figures(
    tokens_per_side: int,
    world: int,
    step_s: float,
    num_workers: int | str,
    on_gpu: bool,
    store: str = "auto",
) -> dict[str, Any]:
    """Demand (tokens/s per rank, both sides) of a step of `tokens_per_side` tokens per side
    on `world` ranks every `step_s` seconds, against the planned workers' rate reading
    `store` (data.store; `auto` is priced as the packed ids `prepare` writes)."""
    workers, how = planned_workers(num_workers, on_gpu)
    read = "tar" if store == "tar" else "packed"
    demand = 2 * tokens_per_side / max(1, world) / max(step_s, 1e-9)
    supply = max(1, workers) * WORKER_TOKENS_PER_S[read]
    return {
        "workers": workers,
        "workers_from": how + f", reading the {'tar shards' if read == 'tar' else 'packed ids'}",
        "demand_tokens_per_s": demand,
        "supply_tokens_per_s": supply,
        "share": demand / supply,
        "bottleneck": demand > FEED_SHARE * supply,
        "source": FEED_SOURCE,
    }


def feed_lines(feed: dict[str, Any] | None, which: str) -> list[str]:
    """The plan's data line (and its warning) for the step `which` names."""
    if not feed:
        return []
    lines = [
        f"data             the {which} step takes {feed['demand_tokens_per_s'] / 1e6:.2f}M "
        f"tokens/s per rank; {feed['workers']} loader worker(s) per rank deliver "
        f"~{feed['supply_tokens_per_s'] / 1e6:.1f}M ({feed['share']:.0%} used; "
        f"{feed['workers_from']}; {feed['source']})"
    ]
    if feed["bottleneck"]:
        lines.append(
            f"WARNING          the loader would be the bottleneck (over {FEED_SHARE:.0%} of what "
            "its workers deliver): raise data.num_workers, or measure with `python -m bench "
            "feed` on the GPU host"
        )
    return lines
