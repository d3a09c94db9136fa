"""Scoring a translated split (sacreBLEU, chrF) and choosing the examples `evaluate` shows."""

from __future__ import annotations

from typing import Any


def score(hyps: list[str], refs: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Corpus BLEU and chrF of detokenised hypotheses against one reference each.

    Returns the figures with their sacreBLEU signatures, and sacreBLEU's own one-line
    renderings of both scores (what `evaluate` prints).
    """
    import sacrebleu

    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    bleu_score = bleu.corpus_score(hyps, [refs])
    chrf_score = chrf.corpus_score(hyps, [refs])
    figures = {
        "sentences": len(hyps),
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }
    lines = [
        f"{bleu_score}  signature: {figures['bleu_signature']}",
        f"{chrf_score}  signature: {figures['chrf_signature']}",
    ]
    return figures, lines


def pick_examples(sources: list[str], n: int, min_words: int = 5, max_words: int = 25) -> list[int]:
    """Indices of `n` sentences spread evenly over the split, preferring sentences of
    `min_words`..`max_words` source words (whole sentences read better than dictionary
    fragments); the same indices every time for the same split."""
    if n <= 0 or not sources:
        return []
    pool = [i for i, s in enumerate(sources) if min_words <= len(s.split()) <= max_words]
    if len(pool) < n:
        pool = list(range(len(sources)))
    step = len(pool) / min(n, len(pool))
    return [pool[int(k * step)] for k in range(min(n, len(pool)))]


def format_examples(
    indices: list[int], sources: list[str], refs: list[str], hyps: list[str]
) -> str:
    """Source, reference and hypothesis of each chosen sentence, as a few readable lines."""
    blocks = []
    for i in indices:
        blocks.append(
            f"[{i}]\n  source     {sources[i]}\n  reference  {refs[i]}\n  hypothesis {hyps[i]}"
        )
    return "\n".join(blocks)
