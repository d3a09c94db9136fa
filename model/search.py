"""Greedy and batched beam search over a trained Transformer.

Both searches decode every live sentence of the batch (times every beam) in one decoder call
per step. As in fairseq, a sentence whose search is over is dropped from the decoder batch at
once (its rows leave the prefixes, the encoder output and the cache), so a batch pays for
each sentence's own length rather than the longest one's; results are written back in the
input order. With `use_cache` (the default) each call feeds only the newest token and the
decoder keeps keys/values in a DecoderCache; without it the whole prefix is recomputed each
step, which is slower but useful to measure what the cache buys (bench/decode.py).

Lengths: a sentence's output may have at most max_len = floor(a * src_len + b) tokens
counting the final EOS (src_len = non-pad source tokens, EOS included); at step max_len only
EOS is allowed, so every hypothesis ends. PAD and BOS are never generated. `min_len` forbids
EOS before that step (used to force fixed-length output when benchmarking). `max_lens` (B,)
gives each sentence's maximum instead of a and b (a budget's probe decodes an untrained model,
which never ends early, to the references' lengths: what a trained model's decode costs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from model.cache import DecoderCache
from model.config import BOS_ID, EOS_ID, PAD_ID
from model.transformer import EncoderOut, Transformer


@dataclass
class Hypothesis:
    """One finished translation: tokens without BOS/EOS, length-penalised log-probability."""

    tokens: list[int]
    score: float


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^alpha; |Y| counts the EOS."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(src: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """Per-sentence maximum output length (B,) int64, at least 1 (room for EOS)."""
    src_len = src.ne(PAD_ID).sum(dim=1).double()  # (B,)
    return torch.floor(max_len_a * src_len + max_len_b).long().clamp(min=1)


def _next_log_probs(
    model: Transformer,
    tokens: Tensor,
    enc: EncoderOut,
    cache: DecoderCache | None,
    step: int,
    max_lens: Tensor,
    min_len: int,
) -> Tensor:
    """Float32 log-probabilities (N, V) of the token at `step` (1-based) for each row.

    tokens (N, step) is every row's prefix starting with BOS; with a cache only its last
    column is fed. Constraints: no PAD or BOS; no EOS before min_len; only EOS at max_len.
    """
    inp = tokens[:, -1:] if cache is not None else tokens  # (N, 1) or (N, step)
    logits = model.decode(inp, enc, cache)[:, -1]  # (N, V)
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    lprobs[:, PAD_ID] = -math.inf
    lprobs[:, BOS_ID] = -math.inf
    if step < min_len:
        lprobs[:, EOS_ID] = -math.inf
    at_max = max_lens.le(step)  # (N,)
    if bool(at_max.any()):
        eos = lprobs[:, EOS_ID].clone()  # (N,)
        lprobs[at_max] = -math.inf
        lprobs[:, EOS_ID] = eos
    return lprobs


@torch.no_grad()
def greedy_search(
    model: Transformer,
    src: Tensor,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    use_cache: bool = True,
    min_len: int = 0,
    max_lens: Tensor | None = None,
) -> list[list[int]]:
    """Most probable next token at every step; returns each sentence's tokens (no BOS/EOS).

    src (B, S), PAD_ID-padded, each sentence ending with EOS. Call model.eval() first.
    A sentence leaves the decoder batch at the step where it emits EOS.
    """
    b = src.shape[0]
    device = src.device
    enc = model.encode(src)
    lens = max_lengths(src, max_len_a, max_len_b) if max_lens is None else max_lens
    lens = lens.to(device)  # (A,) A = live sentences
    max_steps = int(lens.max())
    tokens = torch.full((b, 1), BOS_ID, dtype=torch.long, device=device)  # (A, 1)
    active = torch.arange(b, device=device)  # (A,) input position of each live sentence
    out: list[list[int]] = [[] for _ in range(b)]
    cache = DecoderCache() if use_cache else None
    for step in range(1, max_steps + 1):
        lprobs = _next_log_probs(model, tokens, enc, cache, step, lens, min_len)  # (A, V)
        nxt = lprobs.argmax(dim=-1)  # (A,)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (A, step + 1)
        ended = nxt.eq(EOS_ID)  # (A,)
        if not bool(ended.any()):
            continue
        for i, row in zip(active[ended].tolist(), tokens[ended, 1:-1].tolist(), strict=True):
            out[i] = row
        keep = (~ended).nonzero().squeeze(1)  # (A',) live rows that go on
        tokens, active, lens = tokens[keep], active[keep], lens[keep]
        if keep.numel() == 0:
            break
        enc = enc.select(keep)
        if cache is not None:
            cache.reorder(keep)
    for i, row in zip(active.tolist(), tokens[:, 1:].tolist(), strict=True):
        out[i] = row  # reached the last step without EOS
    return out


@dataclass
class _Beams:
    """The live sentences of a beam search, A of them with K slots each (rows = A * K)."""

    k: int
    tokens: Tensor  # (A*K, step) every slot's prefix from BOS
    scores: Tensor  # (A, K) raw sums of log-probs; -inf for a dead slot
    active: Tensor  # (A,) input position of each live sentence
    n_finished: Tensor  # (A,)
    enc: EncoderOut  # (A*K, S, D)
    lens_rows: Tensor  # (A*K,) each row's sentence's max length

    @classmethod
    def start(cls, model: Transformer, src: Tensor, k: int, lens: Tensor) -> _Beams:
        """N sentences (src (N, S)) with K slots each, only the first slot alive (all are BOS)."""
        n, device = src.shape[0], src.device
        rows = torch.arange(n, device=device).repeat_interleave(k)  # (N*K,)
        scores = torch.full((n, k), -math.inf, device=device)  # (N, K)
        scores[:, 0] = 0.0  # all beams start identical: only one may expand at step 1
        return cls(
            k=k,
            tokens=torch.full((n * k, 1), BOS_ID, dtype=torch.long, device=device),  # (N*K, 1)
            scores=scores,
            active=torch.arange(n, device=device),
            n_finished=torch.zeros(n, dtype=torch.long, device=device),
            enc=model.encode(src).select(rows),  # (N*K, S, D)
            lens_rows=lens.to(device).repeat_interleave(k),
        )

    def candidates(self, lprobs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The 2K best continuations of each sentence, best first: scores, slots, tokens (A, C)."""
        a, k, v = self.scores.shape[0], self.k, lprobs.shape[-1]
        cand = (self.scores[:, :, None] + lprobs.view(a, k, v)).view(a, k * v)  # (A, K*V)
        top_s, top_i = cand.topk(min(2 * k, k * v), dim=1)  # (A, C)
        return top_s, top_i.div(v, rounding_mode="floor"), top_i.remainder(v)

    def finish(
        self, ends: Tensor, beam_idx: Tensor, top_s: Tensor, lp: float, out: list[list[Hypothesis]]
    ) -> None:
        """Hypotheses ending in EOS among the first K ranks (`ends`, (A, K)) join `out`."""
        ei, er = ends.nonzero(as_tuple=True)  # by sentence, then by rank
        ended_rows = ei * self.k + beam_idx[ei, er]
        for i, prefix, s in zip(
            self.active[ei].tolist(),
            self.tokens[ended_rows, 1:].tolist(),
            top_s[ei, er].tolist(),
            strict=True,
        ):
            out[i].append(Hypothesis(prefix, s / lp))
        self.n_finished += ends.sum(dim=1)

    def advance(
        self,
        keep: Tensor,
        scores: Tensor,
        tok: Tensor,
        src_beam: Tensor,
        cache: DecoderCache | None,
    ) -> None:
        """Keep the sentences `keep` (A',), each slot extending slot `src_beam` (A, K) by `tok`."""
        k = self.k
        if keep.numel() < self.scores.shape[0]:
            keep_rows = (keep[:, None] * k + torch.arange(k, device=keep.device)).view(-1)
            self.active, self.n_finished = self.active[keep], self.n_finished[keep]
            scores, tok, src_beam = scores[keep], tok[keep], src_beam[keep]
            self.enc = self.enc.select(keep_rows)
            self.lens_rows = self.lens_rows[keep_rows]
            if cache is not None:
                cache.reorder_cross(keep_rows)
        index = (keep[:, None] * k + src_beam).view(-1)  # (A'*K,) rows of the old batch
        self.tokens = torch.cat([self.tokens.index_select(0, index), tok.view(-1, 1)], dim=1)
        self.scores = scores  # (A', K)
        if cache is not None:
            cache.reorder_self(index)  # beams move only within their sentence


def _refill(
    top_s: Tensor, beam_idx: Tensor, tok: Tensor, taken: Tensor, k: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The K live slots take the extensions `taken` (A, C) in rank order; slots past the number
    taken are dead: they keep their own row and are fed padding at score -inf. Returns each
    slot's score, token and source slot (A, K)."""
    c = top_s.shape[1]
    slots = torch.arange(k, device=top_s.device)  # (K,)
    rank_key = torch.where(taken, c - torch.arange(c, device=top_s.device), 0)  # (A, C)
    pick = rank_key.topk(k, dim=1).indices  # (A, K)
    live = slots[None, :] < taken.sum(dim=1)[:, None]  # (A, K)
    new_scores = top_s.gather(1, pick).masked_fill(~live, -math.inf)  # (A, K)
    new_tok = tok.gather(1, pick).masked_fill(~live, PAD_ID)  # (A, K)
    src_beam = torch.where(live, beam_idx.gather(1, pick), slots[None, :])  # (A, K)
    return new_scores, new_tok, src_beam


def _cannot_improve(
    beams: _Beams,
    full: Tensor,
    best_alive: Tensor,
    finished: list[list[Hypothesis]],
    lens: list[int],
    lenpen: float,
) -> Tensor:
    """(A,) bool: a full sentence whose best live hypothesis, even at the most favourable
    length penalty (its max length), cannot beat its K-th finished one."""
    idx = full.nonzero().squeeze(1)
    stop = torch.zeros_like(full)
    for j, i, alive in zip(
        idx.tolist(), beams.active[idx].tolist(), best_alive[idx].tolist(), strict=True
    ):
        kth = sorted(h.score for h in finished[i])[-beams.k]
        stop[j] = kth >= alive / length_penalty(lens[i], lenpen)
    return stop


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    beam: int = 4,
    lenpen: float = 0.6,
    nbest: int = 1,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    use_cache: bool = True,
    min_len: int = 0,
    early_stop: bool = True,
    max_lens: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search with the GNMT length penalty; nbest hypotheses per sentence, best first.

    Each step scores the beam x V continuations of every live hypothesis and keeps the 2*beam
    best. Walking them in order, a candidate ending in EOS among the first `beam` becomes a
    finished hypothesis (score / lp, never extended again); the others refill the `beam` live
    slots. A sentence is done when no live hypothesis is left (max length), or when it has
    `beam` finished hypotheses and either `early_stop` (the GNMT / fairseq rule: a live
    hypothesis already ranked below all of them; beam 1 is then exactly greedy search) or,
    with early_stop False, no live hypothesis can still beat the beam-th finished one even
    at the most favourable length penalty (an exact bound, since log-probs are <= 0).
    A done sentence leaves the decoder batch (all its `beam` rows) at once.
    """
    if nbest > beam:
        raise ValueError(f"nbest={nbest} > beam={beam}")
    n, k = src.shape[0], beam
    lens = max_lengths(src, max_len_a, max_len_b) if max_lens is None else max_lens  # (N,)
    beams = _Beams.start(model, src, k, lens)
    lens_list = lens.tolist()
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    cache = DecoderCache() if use_cache else None
    for step in range(1, max(lens_list) + 1):
        lprobs = _next_log_probs(
            model, beams.tokens, beams.enc, cache, step, beams.lens_rows, min_len
        )  # (A*K, V)
        top_s, beam_idx, tok = beams.candidates(lprobs)  # (A, C)
        valid = top_s.ne(-math.inf)  # (A, C) a prefix of each row: -inf sorts last
        is_eos = tok.eq(EOS_ID) & valid
        extend = valid & ~is_eos
        taken = extend & extend.cumsum(dim=1).le(k)  # (A, C) the first K extensions
        if bool(is_eos[:, :k].any()):
            beams.finish(is_eos[:, :k], beam_idx, top_s, length_penalty(step, lenpen), finished)
        new_scores, new_tok, src_beam = _refill(top_s, beam_idx, tok, taken, k)
        done = taken.sum(dim=1).eq(0)  # (A,) no live hypothesis left
        full = beams.n_finished.ge(k) & ~done  # (A,)
        if early_stop:
            done |= full
        elif bool(full.any()):
            done |= _cannot_improve(beams, full, new_scores[:, 0], finished, lens_list, lenpen)
        keep = (~done).nonzero().squeeze(1)  # (A',) the sentences that go on
        if keep.numel() == 0:
            break
        beams.advance(keep, new_scores, new_tok, src_beam, cache)
    return [sorted(h, key=lambda x: -x.score)[:nbest] for h in finished]
