"""Carrying a training stream's position over to another world size (or worker count).

The states of *all* ranks of one world are merged into a world-size-free state: per epoch still
in progress, the units finished and the window position of the started ones. Every rank of the
new world loads it and deals the unfinished units of those epochs among the new slots, so the
epoch continues without repeating or skipping a sample.
"""

from __future__ import annotations

from typing import Any

from data_pipeline.dealing import Dealing, unit_key
from data_pipeline.position import (
    Counters,
    EpochProgress,
    Progress,
    WorkerPosition,
    progress_from_json,
    progress_to_json,
)

STATE_VERSION = 3  # 3: block units; 2: WorkerPosition's named keys; 1: "idx"/"ws"/"bd"
READABLE_VERSIONS = (1, 2, 3)
SHARED_KEYS = ("split", "seed", "shuffle", "n_shards", "block", "world_size", "num_workers")


def check_rank_states(states: list[dict[str, Any]]) -> None:
    """All ranks of one world, in a format this version reads; else a one-line ValueError."""
    if not states:
        raise ValueError("merge_state_dicts: no states given")
    first = states[0]
    for s in states:
        if s.get("kind") != "rank" or s.get("version") not in READABLE_VERSIONS:
            raise ValueError("merge_state_dicts: expects states from state_dict()")
        for key in SHARED_KEYS:
            if s.get(key) != first.get(key):
                raise ValueError(
                    f"merge_state_dicts: ranks disagree on {key} ({s.get(key)!r} vs "
                    f"{first.get(key)!r})"
                )
    ranks = sorted(s["rank"] for s in states)
    if ranks != list(range(first["world_size"])):
        raise ValueError(
            f"merge_state_dicts: need the states of all {first['world_size']} ranks, "
            f"got ranks {ranks}"
        )


def saved_dealing(first: dict[str, Any]) -> Dealing:
    """How the ranks of a saved state dealt their units (whole shards before blocks)."""
    block = first.get("block")
    sizes = first.get("shard_samples")
    return Dealing(
        shard_samples=tuple(sizes) if sizes is not None else (0,) * first["n_shards"],
        n_slots=first["world_size"] * first["num_workers"],
        seed=first["seed"],
        shuffle=first["shuffle"],
        block=block,
    )


def epoch_progress(
    first: dict[str, Any],
    positions: list[tuple[int, WorkerPosition]],
    old: EpochProgress,
    epoch: int,
) -> EpochProgress:
    """What all slots did of `epoch`: units finished, and the positions of started ones."""
    dealing = saved_dealing(first)
    done = set(old.done)
    started: dict[str, tuple[int, int]] = {}
    for slot, p in positions:
        if p.epoch < epoch:
            continue
        plan = dealing.slot_plan(slot, epoch, old.done)
        if p.epoch > epoch:
            done.update(unit_key(u) for u in plan)
            continue
        done.update(unit_key(u) for u in plan[: p.unit_index])
        if p.unit_index < len(plan) and p.started:
            started[unit_key(plan[p.unit_index])] = (p.window_start, p.batches_done)
    partial = {k: v for k, v in old.partial.items() if k not in done}
    partial.update(started)
    return EpochProgress(done, partial)


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The merged ("kind": "merged") state of all ranks' `state_dict()`s; counters summed."""
    check_rank_states(states)
    first = states[0]
    nw = first["num_workers"]
    old_base = progress_from_json(first["base"])
    positions: list[tuple[int, WorkerPosition]] = []
    counters = Counters()
    for s in sorted(states, key=lambda s: s["rank"]):
        workers = [WorkerPosition.from_dict(w) for w in s["workers"]]
        positions += [(s["rank"] * nw + w, p) for w, p in enumerate(workers)]
        counters.add(Counters.from_dict(s["base_counters"]))
        for p in workers:
            counters.add(p.counters)
    lo = min(p.epoch for _, p in positions)
    hi = max([p.epoch for _, p in positions] + list(old_base))
    base: Progress = {}
    for epoch in range(lo, hi + 1):
        progress = epoch_progress(first, positions, old_base.get(epoch, EpochProgress()), epoch)
        if progress.done or progress.partial:
            base[epoch] = progress
    return {
        "version": STATE_VERSION,
        "kind": "merged",
        "split": first["split"],
        "seed": first["seed"],
        "shuffle": first["shuffle"],
        "n_shards": first["n_shards"],
        "shard_samples": first.get("shard_samples"),
        "block": first.get("block"),
        "world_size": first["world_size"],
        "n_slots": first["world_size"] * nw,
        "epoch": lo,
        "base": progress_to_json(base),
        "counters": counters.to_dict(),
        "batching": first.get("batching"),
    }
