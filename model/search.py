"""Greedy and batched beam search over a trained Transformer.

Both searches decode every sentence of the batch (times every beam) in one decoder call per
step. With `use_cache` (the default) each call feeds only the newest token and the decoder
keeps keys/values in a DecoderCache; without it the whole prefix is recomputed each step,
which is slower but useful to measure what the cache buys (bench/decode.py).

Lengths: a sentence's output may have at most max_len = floor(a * src_len + b) tokens
counting the final EOS (src_len = non-pad source tokens, EOS included); at step max_len only
EOS is allowed, so every hypothesis ends. PAD and BOS are never generated. `min_len` forbids
EOS before that step (used to force fixed-length output when benchmarking).
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
) -> list[list[int]]:
    """Most probable next token at every step; returns each sentence's tokens (no BOS/EOS).

    src (B, S), PAD_ID-padded, each sentence ending with EOS. Call model.eval() first.
    """
    b = src.shape[0]
    enc = model.encode(src)
    lens = max_lengths(src, max_len_a, max_len_b).to(src.device)  # (B,)
    tokens = torch.full((b, 1), BOS_ID, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(b, dtype=torch.bool, device=src.device)  # (B,)
    cache = DecoderCache() if use_cache else None
    for step in range(1, int(lens.max()) + 1):
        lprobs = _next_log_probs(model, tokens, enc, cache, step, lens, min_len)  # (B, V)
        nxt = lprobs.argmax(dim=-1).masked_fill(finished, PAD_ID)  # (B,)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (B, step + 1)
        finished |= nxt.eq(EOS_ID)
        if bool(finished.all()):
            break
    out: list[list[int]] = []
    for row in tokens[:, 1:].tolist():
        out.append(row[: row.index(EOS_ID)] if EOS_ID in row else row)
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
    """
    if nbest > beam:
        raise ValueError(f"nbest={nbest} > beam={beam}")
    n, k = src.shape[0], beam
    device = src.device
    rows = torch.arange(n, device=device).repeat_interleave(k)  # (N*K,)
    enc = model.encode(src).select(rows)  # out (N*K, S, D)
    lens = max_lengths(src, max_len_a, max_len_b)  # (N,)
    lens_rows = lens.to(device).repeat_interleave(k)  # (N*K,)
    lens_list = lens.tolist()
    tokens = torch.full((n * k, 1), BOS_ID, dtype=torch.long, device=device)  # (N*K, 1)
    scores = torch.full((n, k), -math.inf, device=device)  # (N, K) raw sums of log-probs
    scores[:, 0] = 0.0  # all beams start identical: only one may expand at step 1
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    done = [False] * n
    cache = DecoderCache() if use_cache else None
    for step in range(1, max(lens_list) + 1):
        lprobs = _next_log_probs(model, tokens, enc, cache, step, lens_rows, min_len)  # (N*K, V)
        v = lprobs.shape[-1]
        cand = (scores[:, :, None] + lprobs.view(n, k, v)).view(n, k * v)  # (N, K*V)
        top_s, top_i = cand.topk(min(2 * k, k * v), dim=1)  # (N, 2K)
        top_s_l, top_i_l = top_s.tolist(), top_i.tolist()
        prefixes = tokens[:, 1:].tolist()
        src_rows: list[int] = []
        new_tok: list[int] = []
        new_scores: list[float] = []
        for i in range(n):
            base = i * k
            alive = 0
            if not done[i]:
                for r, (s, idx) in enumerate(zip(top_s_l[i], top_i_l[i], strict=True)):
                    if s == -math.inf:
                        break
                    beam_idx, tok = divmod(idx, v)
                    if tok == EOS_ID:
                        if r < k:
                            lp = length_penalty(step, lenpen)
                            finished[i].append(Hypothesis(prefixes[base + beam_idx], s / lp))
                        continue
                    src_rows.append(base + beam_idx)
                    new_tok.append(tok)
                    new_scores.append(s)
                    alive += 1
                    if alive == k:
                        break
                best_alive = new_scores[len(new_scores) - alive] if alive else -math.inf
                if alive == 0:
                    done[i] = True
                elif len(finished[i]) >= k:
                    if early_stop:
                        done[i] = True
                    else:
                        kth = sorted(h.score for h in finished[i])[-k]
                        bound = best_alive / length_penalty(lens_list[i], lenpen)
                        done[i] = kth >= bound
            for j in range(alive, k):  # dead or done slots: keep a row, feed padding
                src_rows.append(base + j)
                new_tok.append(PAD_ID)
                new_scores.append(-math.inf)
            if done[i]:  # nothing of this sentence may be extended any more
                for j in range(k):
                    new_tok[base + j] = PAD_ID
                    new_scores[base + j] = -math.inf
        if all(done):
            break
        index = torch.tensor(src_rows, dtype=torch.long, device=device)  # (N*K,)
        nxt = torch.tensor(new_tok, dtype=torch.long, device=device)  # (N*K,)
        tokens = torch.cat([tokens.index_select(0, index), nxt[:, None]], dim=1)  # (N*K, step+1)
        scores = torch.tensor(new_scores, device=device).view(n, k)  # (N, K)
        if cache is not None:
            cache.reorder(index)
    return [sorted(h, key=lambda x: -x.score)[:nbest] for h in finished]
