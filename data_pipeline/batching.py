"""Token-budget batching of one shuffle window, and the padded ``Batch`` the trainer consumes.

A window of samples is sorted by length, then cut greedily into batches whose *padded* size
``B * max(S_pad, T_pad)`` stays within ``max_tokens`` (fairseq's ``--max-tokens``: the budget
counts padding, so the memory of a micro-batch is bounded however its lengths are distributed).

The sort key is, from most to least significant: the length bucket
``ceil(max(S_pad, T_pad) / bucket_width)``, then ``S_pad``, ``T_pad``, ``S``, ``T`` (``X_pad`` is
``X`` rounded up to ``pad_multiple``).  So rows that share a bucket are also grouped by their
padded *shape* on both sides, and cuts tend to fall where the shape changes.  A batch also ends
before the budget is reached when the next row would grow its padded shape and the batch is
already :data:`SHAPE_CUT_FILL` full.  Version 3 cuts a batch to a multiple of ``batch_multiple``
rows (the rest opens the next batch): that makes ``B * T``, the row count of every
projection's matrix product, a multiple of 8 without padding any row.  Padding the *lengths* to
a multiple of 8 (``pad_multiple``) costs a short-sentence corpus much more (a 13-token row costs
16 in any batch); ``python -m bench data`` measures both parts.  How low the padding gets
depends mostly on the window: the more rows of each (S, T) shape a window holds, the closer
its batches' rows are in length.
Ties are broken by a random permutation of the window, and the batch order is shuffled
afterwards, so the order stays random.  Everything here is a pure function of its inputs and
the given RNG, which is what makes the loader's resume exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from data_pipeline.tokenizer import BOS_ID, EOS_ID, PAD_ID

BATCHING_VERSION = 3  # sort key and cut of plan_batches (saved with a loader state; see above)
SHAPE_CUT_FILL = 0.9  # a batch this full ends early rather than grow its padded shape


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n`` (and >= ``multiple``)."""
    return max(multiple, -(-n // multiple) * multiple)


@dataclass
class Sample:
    """One decoded pair: source ids end with EOS, target ids carry neither BOS nor EOS."""

    key: str
    src: np.ndarray  # (S,) source ids incl. EOS
    tgt: np.ndarray  # (T-1,) target ids
    src_text: str
    tgt_text: str

    @property
    def src_len(self) -> int:
        """Length of the source row of the batch (EOS included)."""
        return len(self.src)

    @property
    def tgt_len(self) -> int:
        """Length of the ``tgt_in``/``tgt_out`` rows (one BOS or EOS added)."""
        return len(self.tgt) + 1


@dataclass
class Batch:
    """A padded micro-batch.

    ``tgt_in`` is BOS + target (decoder input), ``tgt_out`` is target + EOS (labels); both
    have the same length T.  ``n_src_tokens``/``n_tgt_tokens`` count non-pad positions of
    ``src``/``tgt_out`` (the loss normaliser).  ``keys``/texts identify the samples (BLEU).
    """

    src: torch.Tensor  # (B, S) int64, PAD_ID-padded, S % pad_multiple == 0
    tgt_in: torch.Tensor  # (B, T) int64, BOS + tgt, T % pad_multiple == 0
    tgt_out: torch.Tensor  # (B, T) int64, tgt + EOS
    keys: list[str] = field(default_factory=list)
    src_text: list[str] = field(default_factory=list)
    tgt_text: list[str] = field(default_factory=list)
    n_src_tokens: int = 0
    n_tgt_tokens: int = 0

    @property
    def src_padded(self) -> bool:
        """Whether any source row holds padding (known on the host: no device sync)."""
        return self.n_src_tokens < self.src.shape[0] * self.src.shape[1]

    @property
    def tgt_padded(self) -> bool:
        return self.n_tgt_tokens < self.tgt_out.shape[0] * self.tgt_out.shape[1]

    def __len__(self) -> int:
        return int(self.src.shape[0])

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in TENSORS:
            values[name] = fn(values[name])
        return Batch(**values)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with the three tensors on ``device`` (metadata shared)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """A copy in page-locked memory, so ``to(cuda, non_blocking=True)`` is asynchronous."""
        return self._map(lambda t: t.pin_memory())

    def __reduce__(self) -> tuple[Callable[[dict[str, Any]], Batch], tuple[dict[str, Any]]]:
        """Pickled with its tensors as numpy arrays, whose bytes travel in the pickle.

        A loader worker hands its batches to the rank through a multiprocessing queue, where a
        pickled tensor would cross in a shared-memory segment of its own, its file descriptor
        sent over a connection of its own to the worker's resource sharer: three per batch,
        each a few round trips between the processes (bench data: one worker delivered a third
        of what the same loader delivers in the rank). A batch's ids are ~100 KB (4,096 tokens
        a side, int64), one copy in the queue's pipe."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in TENSORS:
            values[name] = values[name].numpy()
        return _batch_from_arrays, (values,)


TENSORS = ("src", "tgt_in", "tgt_out")  # the fields of a Batch that are tensors


def _batch_from_arrays(values: dict[str, Any]) -> Batch:
    """A pickled Batch (`Batch.__reduce__`) made whole: its arrays as tensors, not copied."""
    for name in TENSORS:
        values[name] = torch.from_numpy(values[name])
    return Batch(**values)


def _sorted_by_length(
    samples: Sequence[Sample], pad_multiple: int, bucket_width: int, rng: np.random.Generator | None
) -> tuple[list[int], list[int], list[int]]:
    """Sample indices sorted by (bucket, padded lengths, lengths), shuffled among equals when
    `rng` is given; with their source and target lengths."""
    n = len(samples)
    order = rng.permutation(n) if rng is not None else np.arange(n)
    s_len = np.fromiter((samples[i].src_len for i in order), dtype=np.int64, count=n)
    t_len = np.fromiter((samples[i].tgt_len for i in order), dtype=np.int64, count=n)
    s_pad = np.maximum(-(-s_len // pad_multiple) * pad_multiple, pad_multiple)
    t_pad = np.maximum(-(-t_len // pad_multiple) * pad_multiple, pad_multiple)
    bucket = -(-np.maximum(s_pad, t_pad) // bucket_width)
    # np.lexsort is stable and sorts by its last key first: ties keep the shuffled order.
    perm = np.lexsort((t_len, s_len, t_pad, s_pad, bucket))
    return order[perm].tolist(), s_len[perm].tolist(), t_len[perm].tolist()


def plan_batches(
    samples: Sequence[Sample],
    *,
    max_tokens: int,
    pad_multiple: int,
    bucket_width: int,
    rng: np.random.Generator | None,
    batch_multiple: int = 1,
) -> list[list[int]]:
    """Group sample indices into token-budget batches (indices into ``samples``).

    With ``rng`` the window is shuffled before sorting (random order among rows of equal
    lengths) and the batch order is shuffled after; without it the order is deterministic and
    stable.  A batch of at least ``batch_multiple`` rows is cut to a multiple of it (fairseq's
    ``--required-batch-size-multiple``); the rows cut off open the next batch, so no row is
    dropped and no padding is added.
    A single sample larger than the budget becomes a batch of its own.
    """
    n = len(samples)
    if n == 0:
        return []
    order, s_len, t_len = _sorted_by_length(samples, pad_multiple, bucket_width, rng)
    batches: list[list[int]] = []
    cur: list[tuple[int, int, int]] = []  # (index, S, T) of the open batch's rows
    cur_s = cur_t = 0
    full = SHAPE_CUT_FILL * max_tokens

    def close() -> None:
        nonlocal cur, cur_s, cur_t
        keep = len(cur) - len(cur) % batch_multiple if len(cur) >= batch_multiple else len(cur)
        batches.append([row[0] for row in cur[:keep]])
        cur = cur[keep:]
        cur_s = max((row[1] for row in cur), default=0)
        cur_t = max((row[2] for row in cur), default=0)

    for i, sl, tl in zip(order, s_len, t_len, strict=True):
        while cur:  # a cut may carry rows over; then the same test again
            s = round_up(max(cur_s, sl), pad_multiple)
            t = round_up(max(cur_t, tl), pad_multiple)
            ps, pt = round_up(cur_s, pad_multiple), round_up(cur_t, pad_multiple)
            over = (len(cur) + 1) * max(s, t) > max_tokens
            if not (over or ((s, t) != (ps, pt) and len(cur) * max(ps, pt) >= full)):
                break
            close()
        cur.append((i, sl, tl))
        cur_s = max(cur_s, sl)
        cur_t = max(cur_t, tl)
    while cur:
        close()
    if rng is not None:
        batches = [batches[j] for j in rng.permutation(len(batches)).tolist()]
    return batches


def collate(samples: Sequence[Sample], pad_multiple: int, text: bool = True) -> Batch:
    """Pad a list of samples into a :class:`Batch` (lengths rounded up to ``pad_multiple``);
    without `text` the batch's text lists stay empty (training batches carry ids only)."""
    b = len(samples)
    s_len = round_up(max(x.src_len for x in samples), pad_multiple)
    t_len = round_up(max(x.tgt_len for x in samples), pad_multiple)
    src = np.full((b, s_len), PAD_ID, dtype=np.int64)  # (B, S)
    tgt_in = np.full((b, t_len), PAD_ID, dtype=np.int64)  # (B, T)
    tgt_out = np.full((b, t_len), PAD_ID, dtype=np.int64)  # (B, T)
    for row, x in enumerate(samples):
        src[row, : x.src_len] = x.src
        n = len(x.tgt)
        tgt_in[row, 0] = BOS_ID
        tgt_in[row, 1 : n + 1] = x.tgt
        tgt_out[row, :n] = x.tgt
        tgt_out[row, n] = EOS_ID
    return Batch(
        src=torch.from_numpy(src),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        keys=[x.key for x in samples],
        src_text=[x.src_text for x in samples] if text else [],
        tgt_text=[x.tgt_text for x in samples] if text else [],
        n_src_tokens=sum(x.src_len for x in samples),
        n_tgt_tokens=sum(x.tgt_len for x in samples),
    )
