"""What every engine shares: text to ids and back, token-budget batches, one `translate()`.

An engine (ours, Transformers, CTranslate2) only says how to search one batch of sentences:
`search(ids, rows, beam, lenpen, nbest)` returns, for each sentence index in `rows`, its n-best
list of (token ids without BOS/EOS, score). `translate()` does the rest the same way for all.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from data_pipeline.tokenizer import Tokenizer
from model.config import EOS_ID, PAD_ID

MAX_LEN_A, MAX_LEN_B = 1.0, 50  # a sentence's output limit: floor(a * src_len + b) (model.search)

Hypotheses = list[tuple[list[int], float]]  # one sentence's n-best: (token ids, score)


class Engine:
    """A loaded export: its tokenizer, a line naming the engine, and its search."""

    tokenizer: Tokenizer
    engine: str  # one line naming the engine, its version and device

    def search(
        self, ids: list[list[int]], rows: list[int], beam: int, lenpen: float, nbest: int
    ) -> list[Hypotheses]:
        """Each of the sentences `ids[i]` (ending with EOS) for i in `rows`: its n-best list."""
        raise NotImplementedError

    def translate(
        self,
        lines: list[str],
        *,
        beam: int = 4,
        lenpen: float = 0.6,
        nbest: int = 1,
        max_tokens: int = 4096,
    ) -> list[list[tuple[str, float]]]:
        """Each input line's n-best list of (detokenised text, score), in input order."""
        ids = [[*seq, EOS_ID] for seq in self.tokenizer.encode(lines)]
        results: list[list[tuple[str, float]]] = [[] for _ in lines]
        with torch.inference_mode():
            for rows in token_batches(ids, max_tokens):
                found = self.search(ids, rows, beam, lenpen, nbest)
                for i, hyps in zip(rows, found, strict=True):
                    texts = self.tokenizer.decode([tokens for tokens, _ in hyps])
                    results[i] = [(t, score) for t, (_, score) in zip(texts, hyps, strict=True)]
        return results


def token_batches(ids: list[list[int]], max_tokens: int) -> Iterator[list[int]]:
    """Indices of `ids` grouped by length so that rows * longest <= max_tokens (at least 1 row)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batch: list[int] = []
    longest = 0
    for i in order:
        longest_if_added = max(longest, len(ids[i]))
        if batch and longest_if_added * (len(batch) + 1) > max_tokens:
            yield batch
            batch, longest_if_added = [], len(ids[i])
        batch.append(i)
        longest = longest_if_added
    if batch:
        yield batch


def pad_sources(ids: list[list[int]], rows: list[int], device: torch.device) -> torch.Tensor:
    """(B, S) PAD-padded sources for the sentences `rows` of `ids` (each ends with EOS)."""
    longest = max(len(ids[i]) for i in rows)
    src = torch.full((len(rows), longest), PAD_ID, dtype=torch.long)  # (B, S)
    for r, i in enumerate(rows):
        src[r, : len(ids[i])] = torch.tensor(ids[i])
    return src.to(device)
