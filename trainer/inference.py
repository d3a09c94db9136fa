"""Translation with an exported model: token-budget batching, beam or greedy search, detokenised."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from data_pipeline.tokenizer import Tokenizer
from model.config import EOS_ID, PAD_ID
from model.search import beam_search
from model.transformer import Transformer
from trainer.export import load_exported
from trainer.run_dir import TOKENIZER


@dataclass
class Translator:
    model: Transformer
    tokenizer: Tokenizer
    device: torch.device

    @classmethod
    def load(cls, export_dir: Path, device: str = "cpu") -> Translator:
        dev = torch.device(device)
        return cls(load_exported(export_dir, dev), Tokenizer(export_dir / TOKENIZER), dev)

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
            for chunk in token_batches(ids, max_tokens):
                longest = max(len(ids[i]) for i in chunk)
                src = torch.full((len(chunk), longest), PAD_ID, dtype=torch.long)  # (B, S)
                for row, i in enumerate(chunk):
                    src[row, : len(ids[i])] = torch.tensor(ids[i])
                hyps = beam_search(
                    self.model, src.to(self.device), beam=beam, lenpen=lenpen, nbest=nbest
                )
                for row, i in enumerate(chunk):
                    texts = self.tokenizer.decode([h.tokens for h in hyps[row]])
                    results[i] = [(t, h.score) for t, h in zip(texts, hyps[row], strict=False)]
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
