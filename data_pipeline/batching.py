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
    keys: Sequence[str] = field(default_factory=list)  # a list, or Keys (packed shards)
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
        of what the same loader delivers in the rank). Ids below 65,536 (every vocabulary
        `prepare` writes in uint16) cross as uint16: a quarter of the int64 bytes (~25 KB at
        4,096 tokens a side) to write, read and copy; the rank widens them back to int64."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in TENSORS:
            ids = values[name].numpy()
            narrow = ids.size == 0 or (int(ids.max()) < 65536 and int(ids.min()) >= 0)
            values[name] = ids.astype(np.uint16) if narrow else ids
        return _batch_from_arrays, (values,)


TENSORS = ("src", "tgt_in", "tgt_out")  # the fields of a Batch that are tensors


def _batch_from_arrays(values: dict[str, Any]) -> Batch:
    """A pickled Batch (`Batch.__reduce__`) made whole: its arrays as tensors, not copied."""
    for name in TENSORS:
        values[name] = torch.from_numpy(values[name].astype(np.int64, copy=False))
    return Batch(**values)


class Keys(Sequence[str]):
    """The keys of a batch's rows from a packed shard: its key prefix and each row's input line,
    formatted only when read (a training step never reads them; formatting every key cost a
    quarter of a batch's making)."""

    __slots__ = ("lines", "prefix")

    def __init__(self, prefix: str, lines: np.ndarray) -> None:
        self.prefix, self.lines = prefix, lines

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [f"{self.prefix}{line:07d}" for line in self.lines[i].tolist()]
        return f"{self.prefix}{int(self.lines[i]):07d}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass
class Rows:
    """A window's usable samples as arrays over a packed shard's ids (data_pipeline/packed.py):
    what `plan_batches` and `collate_rows` take in place of one `Sample` per pair."""

    tokens: np.ndarray  # (M,) the shard's ids: each sample's source, then its target
    offsets: np.ndarray  # (N,) int64, where each sample's source starts in `tokens`
    src_len: np.ndarray  # (N,) int64, source lengths (EOS included)
    tgt_len: np.ndarray  # (N,) int64, target lengths (no BOS, no EOS)
    lines: np.ndarray  # (N,) int64, each sample's input line: its key is key_prefix + 7 digits
    key_prefix: str

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> Sample:
        o, s, t = int(self.offsets[i]), int(self.src_len[i]), int(self.tgt_len[i])
        key = f"{self.key_prefix}{int(self.lines[i]):07d}"
        return Sample(key, self.tokens[o : o + s], self.tokens[o + s : o + s + t], "", "")

    def batch(self, rows: Sequence[int], pad_multiple: int) -> Batch:
        """The padded batch of `rows`, as `collate` makes it from their samples, gathered
        from the ids at once (no loop over rows)."""
        idx = np.asarray(rows, dtype=np.int64)
        off, s, t = self.offsets[idx], self.src_len[idx], self.tgt_len[idx]
        b = len(idx)
        s_max = round_up(int(s.max()), pad_multiple)
        t_max = round_up(int(t.max()) + 1, pad_multiple)
        cols_s, cols_t = np.arange(s_max), np.arange(t_max)
        in_src = cols_s[None, :] < s[:, None]  # (B, S) where the source ids go
        src = np.full((b, s_max), PAD_ID, dtype=np.int64)  # (B, S)
        src[in_src] = self.tokens[(off[:, None] + cols_s[None, :])[in_src]]
        in_tgt = cols_t[None, :] < t[:, None]  # (B, T) where the target ids go in tgt_out
        ids = self.tokens[((off + s)[:, None] + cols_t[None, :])[in_tgt]]  # row by row
        tgt_out = np.full((b, t_max), PAD_ID, dtype=np.int64)  # (B, T)
        tgt_out[in_tgt] = ids
        tgt_out[np.arange(b), t] = EOS_ID
        tgt_in = np.full((b, t_max), PAD_ID, dtype=np.int64)  # (B, T)
        tgt_in[:, 0] = BOS_ID
        tgt_in[:, 1:][in_tgt[:, : t_max - 1]] = ids  # shifted one right
        return Batch(
            src=torch.from_numpy(src),
            tgt_in=torch.from_numpy(tgt_in),
            tgt_out=torch.from_numpy(tgt_out),
            keys=Keys(self.key_prefix, self.lines[idx]),
            n_src_tokens=int(s.sum()),
            n_tgt_tokens=int(t.sum()) + b,
        )


def lengths_of(samples: Sequence[Sample] | Rows) -> tuple[np.ndarray, np.ndarray]:
    """(N,) source and (N,) target row lengths (``Sample.src_len``, ``Sample.tgt_len``)."""
    if isinstance(samples, Rows):
        return samples.src_len, samples.tgt_len + 1
    n = len(samples)
    s_len = np.fromiter((x.src_len for x in samples), dtype=np.int64, count=n)
    t_len = np.fromiter((x.tgt_len for x in samples), dtype=np.int64, count=n)
    return s_len, t_len


def _sorted_by_length(
    samples: Sequence[Sample] | Rows,
    pad_multiple: int,
    bucket_width: int,
    rng: np.random.Generator | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sample indices sorted by (bucket, padded lengths, lengths), shuffled among equals when
    `rng` is given; with their source and target lengths, unpadded and padded."""
    n = len(samples)
    order = rng.permutation(n) if rng is not None else np.arange(n)
    s_all, t_all = lengths_of(samples)
    s_len, t_len = s_all[order], t_all[order]
    s_pad = np.maximum(-(-s_len // pad_multiple) * pad_multiple, pad_multiple)
    t_pad = np.maximum(-(-t_len // pad_multiple) * pad_multiple, pad_multiple)
    bucket = -(-np.maximum(s_pad, t_pad) // bucket_width)
    # np.lexsort is stable and sorts by its last key first: ties keep the shuffled order.
    perm = np.lexsort((t_len, s_len, t_pad, s_pad, bucket))
    return order[perm], s_len[perm], t_len[perm], s_pad[perm], t_pad[perm]


def plan_batches(
    samples: Sequence[Sample] | Rows,
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
    order, _, _, s_pad, t_pad = _sorted_by_length(samples, pad_multiple, bucket_width, rng)
    # A batch's padded shape is the largest padded length of its rows on each side (rounding
    # up commutes with max), so the cut below needs the padded lengths only.
    batches: list[list[int]] = []
    cur: list[tuple[int, int, int]] = []  # (index, S_pad, T_pad) of the open batch's rows
    ps = pt = 0  # the open batch's padded shape
    full = SHAPE_CUT_FILL * max_tokens

    def close() -> None:
        nonlocal cur, ps, pt
        keep = len(cur) - len(cur) % batch_multiple if len(cur) >= batch_multiple else len(cur)
        batches.append([row[0] for row in cur[:keep]])
        cur = cur[keep:]
        ps = max((row[1] for row in cur), default=0)
        pt = max((row[2] for row in cur), default=0)

    for i, sp, tp in zip(order.tolist(), s_pad.tolist(), t_pad.tolist(), strict=True):
        while cur:  # a cut may carry rows over; then the same test again
            s = sp if sp > ps else ps
            t = tp if tp > pt else pt
            over = (len(cur) + 1) * (s if s > t else t) > max_tokens
            grows = s != ps or t != pt
            if not (over or (grows and len(cur) * (ps if ps > pt else pt) >= full)):
                break
            close()
        cur.append((i, sp, tp))
        ps = sp if sp > ps else ps
        pt = tp if tp > pt else pt
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


def collate_rows(
    samples: Sequence[Sample] | Rows, rows: Sequence[int], pad_multiple: int, text: bool
) -> Batch:
    """The batch of `rows` of a window, whichever form its samples take."""
    if isinstance(samples, Rows):
        return samples.batch(rows, pad_multiple)  # (packed ids carry no text)
    return collate([samples[i] for i in rows], pad_multiple, text)
