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
import select
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from data_pipeline.batching import Batch, Sample, collate, plan_batches
from data_pipeline.dealing import Dealing, Unit, unit_key
from data_pipeline.position import Counters, Progress, WorkerPosition
from data_pipeline.read_ahead import ReadAhead
from data_pipeline.shards import RawSample, ShardReadError, decode_sample, iter_shard

log = logging.getLogger("data_pipeline.loader")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Stop signals wait - blocked in this thread, not lost - while loader workers start.

    The loader's fork server, started by the first stream, inherits the mask (and keeps it:
    data_pipeline/worker_start.py), and so does every worker forked from it, so a TERM to every
    process of the job in a worker's first moments, before `ignore_stop_signals` has run in it,
    cannot kill it mid-start (its rank would then fail on a dead worker instead of saving). So
    does multiprocessing's resource tracker, which the first stream starts and which would
    otherwise die of a USR1 sent to every process; starting, it unblocks INT and TERM in this
    thread, hence the second block. The rank itself gets any stop signal as before: another of
    its threads takes it, or this one when the mask is restored.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_stop_signals(worker_id: int) -> None:
    """A loader worker leaves every stop signal to its rank, which finishes its step (or
    abandons it), saves and only then closes its stream.

    USR1 (Slurm's warning before the time limit) and INT (Ctrl-C, sent to the whole process
    group) are ignored. TERM - Slurm's preemption or `scancel` reach every process of the job,
    workers included - is ignored too while the rank still reads batches; once the rank closes
    its stream (`TokenBatchStream.close`, also at the rank's exit), a TERM ends the worker at
    once: the DataLoader and multiprocessing end workers with TERM at shutdown, and a worker
    that ignored it then would hang its rank's exit. A worker whose rank is gone (killed, so
    that it could close nothing) exits by itself (`exit_with_rank`).
    """
    for sig in (signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    info = get_worker_info()
    dataset = info.dataset if info is not None else None
    closing = getattr(dataset, "closing", None)
    rank = getattr(dataset, "rank_pid", None) or os.getppid()
    exit_with_rank(rank)

    def on_term(signum: int, frame: object) -> None:
        if (closing is not None and closing.is_set()) or not process_alive(rank):
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held since its start


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (and is not a zombie waiting for its parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def exit_with_rank(rank_pid: int) -> None:
    """End this process as soon as process `rank_pid` is gone: a thread waits on its pidfd.

    A worker is forked from the rank's fork server (data_pipeline/loader.py), so its parent is
    the server, not the rank, and the DataLoader's own check (is my parent still there?) would
    not see the rank die; the server in turn stays while a worker it made lives, so neither
    would ever end after a SIGKILL of the rank."""

    def wait() -> None:
        try:
            fd = os.pidfd_open(rank_pid)
        except OSError:  # already gone
            os._exit(0)
        select.select([fd], [], [])  # readable once the process has exited
        os._exit(0)

    threading.Thread(target=wait, name="exit-with-rank", daemon=True).start()


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
    shards: list[dict[str, Any]]  # manifest entries: name, samples
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


def window_batches(
    ctx: ProducerContext, samples: list[Sample], epoch: int, u: Unit, ws: int
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
    samples: list[Sample]
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
            for ws, raws in read_unit(ctx, u, ws0, damage):
                if ctx.slow_window_s:
                    time.sleep(ctx.slow_window_s)
                pending = Counters()
                samples = decode_window(ctx, raws, pending, True)
                groups = window_batches(ctx, samples, epoch, u, ws)
                lost = Damage(damage.shard, damage.lost, damage.error)  # set on the last window
                yield Window(ws, len(raws), samples, groups, skip, pending, lost)
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
            batch = collate([w.samples[i] for i in w.groups[j]], ctx.pad_multiple, ctx.text)
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
