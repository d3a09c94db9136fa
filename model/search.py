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
    device = src.device
    rows = torch.arange(n, device=device).repeat_interleave(k)  # (N*K,)
    enc = model.encode(src).select(rows)  # out (A*K, S, D), A = live sentences
    lens = max_lengths(src, max_len_a, max_len_b) if max_lens is None else max_lens  # (N,)
    lens_rows = lens.to(device).repeat_interleave(k)  # (A*K,)
    lens_list = lens.tolist()
    tokens = torch.full((n * k, 1), BOS_ID, dtype=torch.long, device=device)  # (A*K, 1)
    scores = torch.full((n, k), -math.inf, device=device)  # (A, K) raw sums of log-probs
    scores[:, 0] = 0.0  # all beams start identical: only one may expand at step 1
    active = torch.arange(n, device=device)  # (A,) input position of each live sentence
    n_finished = torch.zeros(n, dtype=torch.long, device=device)  # (A,)
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    slots = torch.arange(k, device=device)  # (K,)
    cache = DecoderCache() if use_cache else None
    for step in range(1, max(lens_list) + 1):
        a = scores.shape[0]
        lprobs = _next_log_probs(model, tokens, enc, cache, step, lens_rows, min_len)  # (A*K, V)
        v = lprobs.shape[-1]
        cand = (scores[:, :, None] + lprobs.view(a, k, v)).view(a, k * v)  # (A, K*V)
        top_s, top_i = cand.topk(min(2 * k, k * v), dim=1)  # (A, C) best first
        c = top_s.shape[1]
        beam_idx, tok = top_i.div(v, rounding_mode="floor"), top_i.remainder(v)  # (A, C)
        valid = top_s.ne(-math.inf)  # (A, C) a prefix of each row: -inf sorts last
        is_eos = tok.eq(EOS_ID) & valid
        extend = valid & ~is_eos
        taken = extend & extend.cumsum(dim=1).le(k)  # (A, C) the first K extensions
        n_alive = taken.sum(dim=1)  # (A,)
        ends = is_eos[:, :k]  # (A, K) EOS among the first K ranks: finished hypotheses
        if bool(ends.any()):
            ei, er = ends.nonzero(as_tuple=True)  # by sentence, then by rank
            ended_rows = ei * k + beam_idx[ei, er]
            lp = length_penalty(step, lenpen)
            for i, prefix, s in zip(
                active[ei].tolist(),
                tokens[ended_rows, 1:].tolist(),
                top_s[ei, er].tolist(),
                strict=True,
            ):
                finished[i].append(Hypothesis(prefix, s / lp))
            n_finished += ends.sum(dim=1)
        # the K live slots take the extensions in rank order; slots past n_alive are dead:
        # they keep their own row and are fed padding at score -inf
        rank_key = torch.where(taken, c - torch.arange(c, device=device), 0)  # (A, C)
        pick = rank_key.topk(k, dim=1).indices  # (A, K)
        live = slots[None, :] < n_alive[:, None]  # (A, K)
        new_scores = top_s.gather(1, pick).masked_fill(~live, -math.inf)  # (A, K)
        new_tok = tok.gather(1, pick).masked_fill(~live, PAD_ID)  # (A, K)
        src_beam = torch.where(live, beam_idx.gather(1, pick), slots[None, :])  # (A, K)
        done = n_alive.eq(0)  # (A,)
        full = n_finished.ge(k) & ~done  # (A,)
        if early_stop:
            done |= full
        elif bool(full.any()):
            idx = full.nonzero().squeeze(1)
            stop = []
            for i, best_alive in zip(
                active[idx].tolist(), new_scores[idx, 0].tolist(), strict=True
            ):
                kth = sorted(h.score for h in finished[i])[-k]
                stop.append(kth >= best_alive / length_penalty(lens_list[i], lenpen))
            done[idx[torch.tensor(stop, device=device)]] = True
        src_sent = torch.arange(a, device=device)  # (A',) old position of each kept sentence
        if bool(done.any()):
            src_sent = (~done).nonzero().squeeze(1)
            if src_sent.numel() == 0:
                break
            keep_rows = (src_sent[:, None] * k + slots).view(-1)  # (A'*K,)
            active, n_finished = active[src_sent], n_finished[src_sent]
            new_scores, new_tok, src_beam = (
                new_scores[src_sent],
                new_tok[src_sent],
                src_beam[src_sent],
            )
            enc = enc.select(keep_rows)
            lens_rows = lens_rows[keep_rows]
            if cache is not None:
                cache.reorder_cross(keep_rows)
        index = (src_sent[:, None] * k + src_beam).view(-1)  # (A'*K,) rows of the old batch
        tokens = torch.cat([tokens.index_select(0, index), new_tok.view(-1, 1)], dim=1)
        scores = new_scores  # (A', K)
        if cache is not None:
            cache.reorder_self(index)  # beams move only within their sentence
    return [sorted(h, key=lambda x: -x.score)[:nbest] for h in finished]
