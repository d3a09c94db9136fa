"""How the units of a split are dealt to producer slots: pure functions of the seed, the epoch,
the shard count and the slot count.

The unit of work is a whole shard or - when a split has fewer shards than there are producer
slots (``world_size * max(1, num_workers)``) - the samples ``i % n == p`` of a shard, for each
of the ``n = slots`` parts ``p``. Per epoch the units are ordered (shards shuffled from
``(seed, epoch)`` when ``shuffle``) and dealt round robin: slot ``s`` takes units ``s, s +
slots, ...``; slot ``s`` is worker ``s % workers`` of rank ``s // workers``. So every rank gets
a disjoint part and the union is the whole split, for any world size.
"""

from __future__ import annotations

import numpy as np

Unit = tuple[int, int, int]  # (shard index in the manifest, part, number of parts)


def unit_key(u: Unit) -> str:
    """JSON-friendly name of a unit: ``"7"`` for a whole shard, ``"7:1/4"`` for a part."""
    return str(u[0]) if u[2] == 1 else f"{u[0]}:{u[1]}/{u[2]}"


def parts_for(n_shards: int, n_slots: int) -> int:
    """Shards are split by sample index when there are fewer of them than slots."""
    return 1 if n_shards >= n_slots else n_slots


def epoch_units(n_shards: int, n_slots: int, seed: int, epoch: int, shuffle: bool) -> list[Unit]:
    """All units of an epoch in dealing order."""
    order = list(range(n_shards))
    if shuffle:
        order = np.random.default_rng([seed, epoch, 0x5EED]).permutation(n_shards).tolist()
    n = parts_for(n_shards, n_slots)
    return [(s, p, n) for s in order for p in range(n)]


def slot_plan(
    n_shards: int,
    n_slots: int,
    slot: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    done: frozenset[str] | set[str] = frozenset(),
) -> list[Unit]:
    """Units that ``slot`` processes in ``epoch``: the not-``done`` units dealt round robin."""
    units = [
        u for u in epoch_units(n_shards, n_slots, seed, epoch, shuffle) if unit_key(u) not in done
    ]
    return units[slot::n_slots]
