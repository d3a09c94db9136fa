"""Greedy and beam search: agreement, exhaustive optimality, batching and the cache switch."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from model.config import BOS_ID, EOS_ID, PAD_ID
from model.search import beam_search, greedy_search, length_penalty
from model.transformer import Transformer

from .conftest import build, padded_batch


def rescore(model: Transformer, src_row: torch.Tensor, tokens: list[int], alpha: float) -> float:
    """Teacher-forced sum of log p(tokens + EOS) / lp, for one unpadded source row."""
    src = src_row[src_row.ne(PAD_ID)][None]  # (1, S)
    tgt_in = torch.tensor([[BOS_ID, *tokens]])  # (1, T)
    gold = torch.tensor([[*tokens, EOS_ID]])
    with torch.no_grad():
        lprobs = F.log_softmax(model(src, tgt_in).float(), dim=-1)  # (1, T, V)
    total = lprobs.gather(-1, gold[..., None]).sum().item()
    return total / length_penalty(len(tokens) + 1, alpha)


def eos_happy_model(seed: int, vocab: int = 40, eos_boost: float = 1.0) -> Transformer:
    """A random model with a raised EOS logit, so that hypotheses end at varied lengths."""
    model = build(seed=seed, vocab_size=vocab)
    project = model.output_projection
    bias = torch.zeros(vocab)
    bias[EOS_ID] = eos_boost

    def boosted(h: torch.Tensor) -> torch.Tensor:
        return project(h) + bias

    model.output_projection = boosted  # type: ignore[method-assign]
    return model


def test_beam_one_equals_greedy() -> None:
    lengths: set[tuple[int, int]] = set()
    lens = [7, 3, 5, 9, 2]
    for seed, boost in itertools.product(range(3), (0.8, 1.0, 1.2)):
        model = eos_happy_model(seed, eos_boost=boost)
        src = padded_batch(lens, vocab=40, seed=seed)
        greedy = greedy_search(model, src, max_len_a=1.0, max_len_b=4)
        beam = beam_search(model, src, beam=1, lenpen=0.6, max_len_a=1.0, max_len_b=4)
        assert [h[0].tokens for h in beam] == greedy
        lengths |= {(len(y), n + 3) for y, n in zip(greedy, lens, strict=True)}
    # both early EOS and the length limit were exercised
    assert any(n < limit for n, limit in lengths) and any(n == limit for n, limit in lengths)


def test_cache_switch_does_not_change_results() -> None:
    model = eos_happy_model(19, eos_boost=0.8)
    src = padded_batch([8, 3, 6, 2, 5], vocab=40, seed=19)
    assert greedy_search(model, src, 1.0, 5) == greedy_search(model, src, 1.0, 5, use_cache=False)
    with_cache = beam_search(model, src, beam=3, nbest=3, max_len_b=5)
    without = beam_search(model, src, beam=3, nbest=3, max_len_b=5, use_cache=False)
    for a, b in zip(with_cache, without, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert all(abs(x.score - y.score) < 1e-4 for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("lenpen", [0.0, 0.6, 2.0])
def test_wide_beam_is_exhaustive(lenpen: float, early_stop: bool) -> None:
    vocab, max_len = 8, 3  # outputs: up to 2 tokens from {UNK, 4..7}, then EOS
    model = build(seed=3, vocab_size=vocab, init_std=0.5)
    src = padded_batch([4], vocab=vocab, seed=5)
    allowed = [t for t in range(vocab) if t not in (PAD_ID, BOS_ID, EOS_ID)]
    every = [list(p) for n in range(max_len) for p in itertools.product(allowed, repeat=n)]
    exact = sorted(((rescore(model, src[0], y, lenpen), y) for y in every), reverse=True)
    assert len(exact) == 31
    # 30 live candidates at step 2 is the widest step, so a beam of 31 prunes nothing.
    found = beam_search(
        model,
        src,
        beam=31,
        nbest=31,
        lenpen=lenpen,
        max_len_a=0.0,
        max_len_b=max_len,
        early_stop=early_stop,
    )[0]
    assert [h.tokens for h in found] == [y for _, y in exact]
    assert all(abs(h.score - s) < 1e-4 for h, (s, _) in zip(found, exact, strict=True))


def test_finished_hypotheses_are_never_extended() -> None:
    model = eos_happy_model(10, eos_boost=0.8)
    src = padded_batch([8, 3, 6, 2, 5], vocab=40, seed=10)
    fed: list[torch.Tensor] = []
    decode = model.decode

    def spy(tgt_in: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        fed.append(tgt_in.clone())
        return decode(tgt_in, *args, **kwargs)  # type: ignore[arg-type]

    model.decode = spy  # type: ignore[method-assign]
    hyps = beam_search(model, src, beam=4, nbest=4, lenpen=0.6, max_len_b=6)
    del model.decode
    assert len({len(h.tokens) for sentence in hyps for h in sentence}) > 3  # varied lengths
    assert fed and all(not bool(x.eq(EOS_ID).any()) for x in fed)  # EOS never fed back
    for i, sentence in enumerate(hyps):
        assert len(sentence) == 4
        scores = [h.score for h in sentence]
        assert scores == sorted(scores, reverse=True)
        for h in sentence:
            assert EOS_ID not in h.tokens and PAD_ID not in h.tokens and BOS_ID not in h.tokens
            assert abs(h.score - rescore(model, src[i], h.tokens, 0.6)) < 1e-4


def test_batched_equals_one_by_one() -> None:
    model = eos_happy_model(0, eos_boost=1.2)
    src = padded_batch([8, 3, 6, 2, 5], vocab=40, seed=0)
    batched = beam_search(model, src, beam=4, nbest=4, max_len_b=5)
    greedy = greedy_search(model, src, max_len_b=5)
    for i in range(src.shape[0]):
        row = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]  # (1, S_i) unpadded
        alone = beam_search(model, row, beam=4, nbest=4, max_len_b=5)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert all(abs(a.score - b.score) < 1e-4 for a, b in zip(alone, batched[i], strict=True))
        assert greedy_search(model, row, max_len_b=5)[0] == greedy[i]
    assert len({len(h.tokens) for sentence in batched for h in sentence}) > 3  # varied lengths


def test_length_limits() -> None:
    model = build(seed=2)
    src = padded_batch([5, 2], vocab=40)
    # min_len = max_len forces exactly max_len - 1 tokens before the EOS
    out = greedy_search(model, src, max_len_a=0.0, max_len_b=7, min_len=7)
    assert [len(y) for y in out] == [6, 6]
    out = greedy_search(model, src, max_len_a=1.0, max_len_b=0)  # src_len + 0, EOS counted
    assert all(len(y) <= n - 1 for y, n in zip(out, [5, 2], strict=True))
    hyps = beam_search(model, src, beam=3, max_len_a=0.0, max_len_b=7, min_len=7)
    assert [len(h[0].tokens) for h in hyps] == [6, 6]
    # per-sentence limits (a budget's probe: the references' lengths) replace a and b; a model
    # that never picks EOS by itself (as an untrained one) stops at each sentence's own limit
    never_ends = eos_happy_model(2, eos_boost=-1e4)
    limits = torch.tensor([4, 9])
    assert [len(y) for y in greedy_search(never_ends, src, max_lens=limits)] == [3, 8]
    hyps = beam_search(never_ends, src, beam=3, max_lens=limits)
    assert [len(h[0].tokens) for h in hyps] == [3, 8]


def test_exact_stopping_is_never_worse_than_early_stopping() -> None:
    # A strong length penalty rewards long outputs, so stopping at the first `beam` finished
    # hypotheses (early_stop) can miss better ones that the exact bound keeps searching for.
    gains: list[float] = []
    for seed, boost in ((0, 1.0), (5, 1.5)):
        model = eos_happy_model(seed, eos_boost=boost)
        src = padded_batch([7, 3, 5, 9, 2], vocab=40, seed=seed)
        early = beam_search(model, src, beam=2, lenpen=4.0, max_len_b=4)
        exact = beam_search(model, src, beam=2, lenpen=4.0, max_len_b=4, early_stop=False)
        gains += [b[0].score - a[0].score for a, b in zip(early, exact, strict=True)]
    assert min(gains) > -1e-6
    assert max(gains) > 0.1


def count_decoder_rows(model: Transformer) -> list[int]:
    """Patch model.decode to record the batch size of every call (undo with `del`)."""
    rows: list[int] = []
    decode = model.decode

    def counting(tgt_in: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        rows.append(tgt_in.shape[0])
        return decode(tgt_in, *args, **kwargs)  # type: ignore[arg-type]

    model.decode = counting  # type: ignore[method-assign]
    return rows


@pytest.mark.parametrize("use_cache", [True, False])
def test_finished_sentences_leave_the_batch(use_cache: bool) -> None:
    # Very different source lengths (so max lengths of 4 to 32 tokens) and a raised EOS logit:
    # sentences end at very different steps, and each must leave the decoder batch then,
    # without changing any output.
    model = eos_happy_model(4, eos_boost=0.5)
    lens = [2, 30, 4, 25, 3, 12, 2, 18]
    src = padded_batch(lens, vocab=40, seed=4)
    length = dict(max_len_a=1.0, max_len_b=2, use_cache=use_cache)
    rows = count_decoder_rows(model)
    greedy = greedy_search(model, src, **length)  # type: ignore[arg-type]
    greedy_rows = list(rows)
    rows.clear()
    batched = beam_search(model, src, beam=3, nbest=3, **length)  # type: ignore[arg-type]
    beam_rows = list(rows)
    del model.decode
    for calls, per_sentence in ((greedy_rows, 1), (beam_rows, 3)):
        assert calls[0] == len(lens) * per_sentence
        assert all(b <= a for a, b in itertools.pairwise(calls))  # never grows
        assert calls[-1] == per_sentence  # the longest sentence ends alone
        assert len(set(calls)) >= 4  # sentences left at several different steps
        assert sum(calls) < 0.6 * len(calls) * calls[0]
    assert len({len(y) for y in greedy}) >= 4
    assert len({len(h[0].tokens) for h in batched}) >= 4
    for i, n in enumerate(lens):
        row = src[i : i + 1, :n]  # (1, n) unpadded
        assert greedy_search(model, row, **length)[0] == greedy[i]  # type: ignore[arg-type]
        alone = beam_search(model, row, beam=3, nbest=3, **length)[0]  # type: ignore[arg-type]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert all(abs(a.score - b.score) < 1e-4 for a, b in zip(alone, batched[i], strict=True))
