"""How the units of a split are dealt to producer slots: pure functions of the shard sizes, the
seed, the epoch, the slot count and the block size.

A unit is a run of samples of one shard that one producer slot reads:

- a *block*: ``block`` consecutive samples of a shard (the last block of a shard may be
  shorter; a shard of at most ``block`` samples is one whole-shard unit);
- a *part*: when a split has fewer shards than producer slots (``world_size *
  max(1, num_workers)``), the samples ``i % n == p`` of a shard, for each of the ``n = slots``
  parts ``p``;
- a *whole shard*: in states saved before blocks existed (``block`` is ``None``).

Per epoch the shards are ordered (shuffled from ``(seed, epoch)`` when ``shuffle``), each
shard's units follow in order, and the units are dealt round robin: slot ``s`` takes units
``s, s + slots, ...``; slot ``s`` is worker ``s % workers`` of rank ``s // workers``. So every
rank gets a disjoint part and the union is the whole split, for any world size; and since a
block is one shuffle window, every slot reads within one window as many samples as any other
whatever the shard sizes (with whole shards, a rank dealt a short shard ran into its next epoch
while another still read its long one: the short shard's samples were seen more often).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Unit = tuple[int, int, int]  # (shard index in the manifest, block or part, 0 for a block or parts)


def unit_key(u: Unit) -> str:
    """JSON-friendly name of a unit: ``"7"`` a whole shard, ``"7#3"`` a block, ``"7:1/4"`` a
    part."""
    if u[2] == 0:
        return f"{u[0]}#{u[1]}"
    return str(u[0]) if u[2] == 1 else f"{u[0]}:{u[1]}/{u[2]}"


def parts_for(n_shards: int, n_slots: int) -> int:
    """Shards are split by sample index when there are fewer of them than slots."""
    return 1 if n_shards >= n_slots else n_slots


@dataclass(frozen=True)
class Span:
    """The samples of a unit: raw shard indices ``first + k * stride`` for ``k < count``."""

    first: int
    stride: int
    count: int


@dataclass(frozen=True)
class Dealing:
    """The units of a split and who reads them (see the module docstring)."""

    shard_samples: tuple[int, ...]
    n_slots: int
    seed: int
    shuffle: bool
    block: int | None  # samples per block; None: whole-shard units

    @property
    def n_shards(self) -> int:
        return len(self.shard_samples)

    def shard_units(self, shard: int) -> list[Unit]:
        """The units of one shard, in reading order."""
        n = parts_for(self.n_shards, self.n_slots)
        if n > 1:
            return [(shard, p, n) for p in range(n)]
        size = self.shard_samples[shard]
        if self.block is None or size <= self.block:
            return [(shard, 0, 1)]
        return [(shard, b, 0) for b in range(-(-size // self.block))]

    def epoch_units(self, epoch: int) -> list[Unit]:
        """All units of an epoch in dealing order."""
        order = list(range(self.n_shards))
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch, 0x5EED])
            order = rng.permutation(self.n_shards).tolist()
        return [u for s in order for u in self.shard_units(s)]

    def slot_plan(
        self, slot: int, epoch: int, done: frozenset[str] | set[str] = frozenset()
    ) -> list[Unit]:
        """Units that ``slot`` processes in ``epoch``: the not-``done`` units dealt round robin."""
        units = [u for u in self.epoch_units(epoch) if unit_key(u) not in done]
        return units[slot :: self.n_slots]

    def span(self, u: Unit) -> Span:
        """Which samples of its shard unit `u` holds."""
        size = self.shard_samples[u[0]]
        if u[2] == 0:
            assert self.block is not None, "a block unit needs a block size"
            first = u[1] * self.block
            return Span(first, 1, min(self.block, size - first))
        return Span(u[1], u[2], len(range(u[1], size, u[2])))
