"""The producer of one slot: reads its units in windows, cuts token-budget batches, and yields
each with its position after it. Runs in a DataLoader worker, or in the main process with
``num_workers == 0``.

A window is shuffled from ``(seed, epoch, unit, window start)``, bucketed by length and cut
into token-budget batches (data_pipeline/batching.py), whose order is shuffled too. A window
therefore depends on nothing but its unit and position: the stream of batches of a unit is the
same whichever slot reads it, which is what makes resuming exact, also on another world size.

Damage: a corrupt or truncated shard is skipped from the point of damage; the samples it did
not deliver (counted against the manifest's per-shard count) go to ``samples_skipped_corrupt``
and the shard is named in ``bad_shards`` and in a warning. A malformed sample (bad id bytes,
ids beyond the vocabulary) is skipped and counted the same way.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from data_pipeline.batching import Batch, Rows, Sample, collate_rows, plan_batches
from data_pipeline.dealing import Dealing, Unit, unit_key
from data_pipeline.packed import PackedError, PackedShard
from data_pipeline.position import Counters, Progress, WorkerPosition
from data_pipeline.read_ahead import ReadAhead
from data_pipeline.shards import RawSample, ShardReadError, decode_sample, iter_shard

log = logging.getLogger("data_pipeline.loader")


@dataclass
class Item:
    """What a producer yields: its worker id, its position after this item, maybe a batch."""

    worker: int
    pos: WorkerPosition
    batch: Batch | None

    def pin_memory(self) -> Item:
        """Called by the DataLoader's pinning thread (``pin_memory=True``)."""
        return Item(self.worker, self.pos, self.batch.pin_memory() if self.batch else None)


@dataclass
class ProducerContext:
    """Everything a producer needs (picklable; shipped to DataLoader workers)."""

    data_dir: str
    split: str
    shards: list[dict[str, Any]]  # manifest entries: name, samples (and packed, when read)
    dtype: str
    vocab_size: int
    max_tokens: int
    max_len: int
    pad_multiple: int
    bucket_width: int
    batch_multiple: int
    window: int
    shuffle: bool
    skip_long: bool
    seed: int
    dealing: Dealing
    slot0: int  # first slot of this rank: rank * workers
    end_epoch: int | None  # exclusive; None = endless
    base: Progress = field(default_factory=dict)  # merged progress of a world-size change
    text: bool = True  # samples carry their text (BLEU, `translate`); training needs ids only
    read_ahead: int = 1  # windows read and cut ahead by a thread; 0: each when its turn comes
    store: str = "tar"  # what the samples are read from: "tar", or "packed" (ids, no text)
    slow_window_s: float = 0.0  # the fault seam of a slow reader: a sleep per window built


@dataclass
class Damage:
    """What a damaged shard did not deliver, found while reading one unit."""

    shard: str = ""
    lost: int = 0
    error: str = ""


def read_unit(
    ctx: ProducerContext, u: Unit, start: int, damage: Damage
) -> Iterator[tuple[int, list[RawSample]]]:
    """Windows ``(window start, raw samples)`` of a unit from sample offset ``start`` on.

    On damage the partial window is still yielded, and `damage` says what was lost.
    """
    shard = ctx.shards[u[0]]
    span = ctx.dealing.span(u)
    k, window, ws, error = 0, [], start, ""  # k: unit samples read so far
    try:
        # Unit sample number k is raw sample `first + k * stride`: seek up to number `start`.
        path = Path(ctx.data_dir) / shard["name"]
        for raw in iter_shard(path, skip_before=span.first + start * span.stride, text=ctx.text):
            if raw.index < span.first or (raw.index - span.first) % span.stride:
                continue
            k += 1
            if k > start:
                window.append(raw)
                if len(window) == ctx.window:
                    yield ws, window
                    ws, window = ws + len(window), []
            if k == span.count:
                break
    except ShardReadError as exc:
        error = str(exc)
    except FileNotFoundError:
        error = f"{shard['name']}: missing"
    if not error and k < span.count:
        error = f"{shard['name']}: truncated ({k} of {span.count} samples)"
    if error:
        damage.shard, damage.lost, damage.error = shard["name"], span.count - max(k, start), error
    if window or error:
        yield ws, window


def decode_window(
    ctx: ProducerContext, raws: list[RawSample], pending: Counters, count: bool
) -> list[Sample]:
    """The usable samples of a window; malformed and (on train) too long ones are skipped and,
    when `count`, counted in `pending`."""
    samples: list[Sample] = []
    for raw in raws:
        try:
            src, tgt = decode_sample(raw, ctx.dtype, ctx.vocab_size)
        except ValueError:
            pending.samples_skipped_corrupt += int(count)
            continue
        src_text = raw.parts.get("src.txt", b"").decode("utf-8", "replace") if ctx.text else ""
        tgt_text = raw.parts.get("tgt.txt", b"").decode("utf-8", "replace") if ctx.text else ""
        sample = Sample(raw.key, src, tgt, src_text, tgt_text)
        if ctx.skip_long and max(sample.src_len, sample.tgt_len) > ctx.max_len:
            pending.samples_skipped_long += int(count)
            continue
        samples.append(sample)
    return samples


_WARNED: set[tuple[str, str]] = set()  # (data dir, shard) whose packed file did not open
_OPEN: dict[tuple, PackedShard] = {}  # the last packed file opened


def open_packed(data_dir: str, entry: dict[str, Any], dtype: str, vocab: int) -> PackedShard:
    """A shard's packed file, checked once for all the units it holds (a window's block each):
    the last one opened is kept while the file is the same (inode, size, modification)."""
    try:
        st = os.stat(Path(data_dir, entry["packed"]["name"]))
    except FileNotFoundError:
        raise PackedError(f"{entry['packed']['name']}: missing") from None
    key = (data_dir, entry["packed"]["name"], st.st_ino, st.st_size, st.st_mtime_ns)
    shard = _OPEN.get(key)
    if shard is None:
        shard = PackedShard(Path(data_dir), entry, dtype, vocab)
        _OPEN.clear()
        _OPEN[key] = shard
    return shard


def unit_windows(
    ctx: ProducerContext, u: Unit, start: int, damage: Damage
) -> Iterator[tuple[int, int, list[Sample] | Rows, Counters]]:
    """``(window start, samples read, usable samples, what was skipped)`` of a unit from sample
    offset `start` on: from its shard's packed ids (data_pipeline/packed.py) where the stream
    reads them, else from its tar. A packed file that does not open as the manifest describes
    it is named in a warning and the tar read instead."""
    entry = ctx.shards[u[0]]
    if ctx.store == "packed":
        try:
            shard = open_packed(ctx.data_dir, entry, ctx.dtype, ctx.vocab_size)
        except PackedError as exc:
            if (ctx.data_dir, entry["name"]) not in _WARNED:  # once a process, not every unit
                _WARNED.add((ctx.data_dir, entry["name"]))
                log.warning("data %s: %s; reading %s instead", ctx.split, exc, entry["name"])
        else:
            span = ctx.dealing.span(u)
            max_len = ctx.max_len if ctx.skip_long else None
            for ws, n, samples, bad, too_long in shard.windows(
                span.first, span.stride, span.count, start, ctx.window, max_len
            ):
                yield ws, n, samples, Counters(samples_skipped_corrupt=bad,
                                               samples_skipped_long=too_long)  # fmt: skip
            return
    for ws, raws in read_unit(ctx, u, start, damage):
        pending = Counters()
        samples = decode_window(ctx, raws, pending, True)
        yield ws, len(raws), samples, pending


def window_batches(
    ctx: ProducerContext, samples: list[Sample] | Rows, epoch: int, u: Unit, ws: int
) -> list[list[int]]:
    """The window cut into batches (indices into `samples`), shuffled from its identity."""
    rng = np.random.default_rng([ctx.seed, epoch, *u, ws]) if ctx.shuffle else None
    return plan_batches(
        samples,
        max_tokens=ctx.max_tokens,
        pad_multiple=ctx.pad_multiple,
        bucket_width=ctx.bucket_width,
        rng=rng,
        batch_multiple=ctx.batch_multiple,
    )


@dataclass
class Window:
    """One window of a unit, read, decoded and cut into batches: what the producer hands out
    batch by batch. `skip` batches of it were delivered before a resume; its counts of
    skipped samples and its damage count only where `skip` is 0 (else they were counted when
    the window was first built)."""

    ws: int  # sample offset of the window in its unit
    n_raw: int  # samples read (the next window starts n_raw further on)
    samples: list[Sample] | Rows  # Rows: over a packed shard's ids
    groups: list[list[int]]  # batches, as indices into `samples`
    skip: int
    pending: Counters  # malformed and too-long samples of this window
    damage: Damage  # what the unit's damaged shard lost, on the unit's last window


UNIT_END, EPOCH_END = "unit end", "epoch end"  # the slot finished a unit, an epoch of its plan
Event = Window | str


def slot_windows(ctx: ProducerContext, slot: int, start: WorkerPosition) -> Iterator[Event]:
    """Every window of the slot from position `start` on, in order, with the ends of units and
    epochs between them: a pure function of its arguments, so that it can run ahead of the
    batches being handed out (in a thread: `read_ahead`)."""
    epoch, unit_index, resuming = start.epoch, start.unit_index, start.started
    while ctx.end_epoch is None or epoch < ctx.end_epoch:
        base = ctx.base.get(epoch)
        plan = ctx.dealing.slot_plan(slot, epoch, base.done if base else frozenset())
        while unit_index < len(plan):
            u = plan[unit_index]
            if resuming:
                ws0, skip = start.window_start, start.batches_done
            else:
                ws0, skip = (base.partial if base else {}).get(unit_key(u), (0, 0))
            resuming = False
            damage = Damage()
            for ws, n_raw, samples, pending in unit_windows(ctx, u, ws0, damage):
                if ctx.slow_window_s:
                    time.sleep(ctx.slow_window_s)
                groups = window_batches(ctx, samples, epoch, u, ws)
                lost = Damage(damage.shard, damage.lost, damage.error)  # set on the last window
                yield Window(ws, n_raw, samples, groups, skip, pending, lost)
                skip = 0
            yield UNIT_END
            unit_index += 1
        yield EPOCH_END
        epoch, unit_index = epoch + 1, 0


class _Producer:
    """One slot's producer from a position on; `items()` yields what the module describes."""

    def __init__(self, ctx: ProducerContext, worker: int, slot: int, pos: WorkerPosition) -> None:
        self.ctx, self.worker, self.slot = ctx, worker, slot
        self.pos = pos.copy()
        self.pending = Counters()  # window statistics not yet delivered with a batch

    def flush(self) -> None:
        self.pos.counters.add(self.pending)
        self.pending = Counters()

    def items(self) -> Iterator[Item]:
        ctx, pos = self.ctx, self.pos
        events: Iterator[Event] = slot_windows(ctx, self.slot, pos)
        ahead = None
        if ctx.read_ahead > 0:
            ahead = ReadAhead(events, ctx.read_ahead, lambda e: isinstance(e, Window))
        try:
            yield from self._from_events(iter(ahead) if ahead else events)
        finally:
            if ahead:
                ahead.close()

    def _from_events(self, events: Iterator[Event]) -> Iterator[Item]:
        ctx, pos = self.ctx, self.pos
        fresh = pos.unit_index == 0 and not pos.started  # a whole epoch ahead
        produced = 0
        for event in events:
            if isinstance(event, Window):
                for item in self.window_items(event):
                    produced += 1
                    yield item
            elif event == UNIT_END:
                pos.next_unit()
            else:
                epoch = pos.epoch
                pos.next_epoch()
                if ctx.end_epoch is None and fresh and ctx.base.get(epoch) is None and not produced:
                    # Endless and a whole epoch gave nothing (e.g. every pair too long): stop.
                    log.warning("data %s: slot %d produced no batch in epoch %d; stopping it",
                                ctx.split, self.slot, epoch)  # fmt: skip
                    break
                fresh, produced = True, 0
        self.flush()
        yield Item(self.worker, pos.copy(), None)

    def window_items(self, w: Window) -> Iterator[Item]:
        """The batches of window `w` from the position on."""
        ctx, pos = self.ctx, self.pos
        if not pos.started:
            pos.window_start, pos.batches_done = w.ws, w.skip
        count = w.skip == 0  # else counted when this window was first built
        if count:
            self.pending.add(w.pending)
        if w.damage.shard and count:
            self.pending.samples_skipped_corrupt += w.damage.lost
            self.pending.bad_shards.append(w.damage.shard)
            log.warning("data %s: skipping the rest of %s (%d samples lost)",
                        ctx.split, w.damage.error, w.damage.lost)  # fmt: skip
        for j in range(w.skip, len(w.groups)):
            batch = collate_rows(w.samples, w.groups[j], ctx.pad_multiple, ctx.text)
            self.flush()
            pos.counters.samples_seen += len(batch)
            pos.counters.batches += 1
            pos.window_start, pos.batches_done = w.ws, j + 1
            yield Item(self.worker, pos.copy(), batch)
        pos.window_start, pos.batches_done = w.ws + w.n_raw, 0


def produce(ctx: ProducerContext, worker: int, slot: int, pos: WorkerPosition) -> Iterator[Item]:
    """The items of one producer slot from `pos` on; the last one has no batch and carries
    the position at the end (with the counters of windows that yielded nothing)."""
    return _Producer(ctx, worker, slot, pos).items()


class WorkerDataset(IterableDataset):
    """Runs logical worker ``(worker id + rotation) % workers`` in each DataLoader worker."""

    def __init__(
        self,
        ctx: ProducerContext,
        positions: list[WorkerPosition],
        rotation: int,
        closing: Any = None,
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.positions = positions
        self.rotation = rotation
        self.closing = closing  # a multiprocessing Event: set when the rank closes its stream
        self.rank_pid = os.getpid()  # the rank that made it, which its workers outlive never

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        n = len(self.positions)
        worker = ((info.id if info is not None else 0) + self.rotation) % n
        return produce(self.ctx, worker, self.ctx.slot0 + worker, self.positions[worker])
