"""Where a producer of the training stream stands, as typed values that save to JSON.

A producer slot works through the units of its plan (data_pipeline/dealing.py), each in
windows of `shuffle_buffer` samples cut into batches. Its position after a batch is
`WorkerPosition(epoch, unit_index, window_start, batches_done, counters)`: resuming rebuilds
that window and drops the `batches_done` batches already delivered. `EpochProgress` is what a
resumed run on another world size knows of an epoch: the units finished and, for started
ones, their window position.

Saved form (`to_dict`): {"epoch", "unit_index", "window_start", "batches_done", "counters"}.
States saved before version 2 used the keys "idx", "ws" and "bd"; `from_dict` reads both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COUNTER_NAMES = ("samples_seen", "samples_skipped_long", "samples_skipped_corrupt", "batches")
NOT_STARTED = -1  # window_start of a unit not started yet (take the merged progress or 0)


@dataclass
class Counters:
    """Per-epoch-independent totals of one producer (or a sum of several)."""

    samples_seen: int = 0
    samples_skipped_long: int = 0
    samples_skipped_corrupt: int = 0
    batches: int = 0
    bad_shards: list[str] = field(default_factory=list)

    def add(self, other: Counters) -> None:
        """Add `other`'s counts; a damaged shard is named once."""
        for name in COUNTER_NAMES:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.bad_shards += [b for b in other.bad_shards if b not in self.bad_shards]

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in COUNTER_NAMES}, "bad_shards": list(self.bad_shards)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Counters:
        return cls(**{k: int(d[k]) for k in COUNTER_NAMES}, bad_shards=list(d["bad_shards"]))

    @classmethod
    def total(cls, parts: list[Counters]) -> Counters:
        out = cls()
        for part in parts:
            out.add(part)
        return out


@dataclass
class WorkerPosition:
    """A producer's position after the last batch it delivered (see the module docstring)."""

    epoch: int
    unit_index: int = 0  # index of the current unit in the slot's plan for `epoch`
    window_start: int = NOT_STARTED  # sample offset of the current window within the unit
    batches_done: int = 0  # batches of that window delivered
    counters: Counters = field(default_factory=Counters)

    @property
    def started(self) -> bool:
        """Whether the current unit has been started (its window position is known)."""
        return self.window_start >= 0

    def next_unit(self) -> None:
        self.unit_index += 1
        self.window_start, self.batches_done = NOT_STARTED, 0

    def next_epoch(self) -> None:
        self.epoch += 1
        self.unit_index, self.window_start, self.batches_done = 0, NOT_STARTED, 0

    def copy(self) -> WorkerPosition:
        return WorkerPosition.from_dict(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "unit_index": self.unit_index,
            "window_start": self.window_start,
            "batches_done": self.batches_done,
            "counters": self.counters.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerPosition:
        """Version 2 keys, or the abbreviations of version 1 ("idx", "ws", "bd")."""
        old = "unit_index" not in d
        return cls(
            epoch=int(d["epoch"]),
            unit_index=int(d["idx"] if old else d["unit_index"]),
            window_start=int(d["ws"] if old else d["window_start"]),
            batches_done=int(d["bd"] if old else d["batches_done"]),
            counters=Counters.from_dict(d["counters"]),
        )


@dataclass
class EpochProgress:
    """Of one epoch: the units finished, and (window start, batches done) of started ones."""

    done: set[str] = field(default_factory=set)
    partial: dict[str, tuple[int, int]] = field(default_factory=dict)

    def replay_windows(self) -> None:
        """Restart every open window (its batches were cut with other settings)."""
        self.partial = {k: (ws, 0) for k, (ws, _) in self.partial.items()}


Progress = dict[int, EpochProgress]  # epoch -> progress


def progress_to_json(progress: Progress) -> list[dict[str, Any]]:
    return [
        {
            "epoch": e,
            "done": sorted(p.done),
            "partial": {k: list(v) for k, v in p.partial.items()},
        }
        for e, p in sorted(progress.items())
    ]


def progress_from_json(items: list[dict[str, Any]]) -> Progress:
    return {
        int(b["epoch"]): EpochProgress(
            done=set(b["done"]),
            partial={k: (int(v[0]), int(v[1])) for k, v in b["partial"].items()},
        )
        for b in items
    }
