"""Translation with a Transformers export: MarianMTModel.generate under our search rules.

Text goes through the export's own sentencepiece model (`source.spm`, our spm.model) with our
tokenizer, so ids and detokenised text are those of `paperscale translate` on our export.
Search: `generate` with the beam, length penalty and `early_stopping=True` of model/search.py
and `SearchRules` (trainer/serve/hf_rules.py) for its token rules and per-sentence length
limits. With `--lenpen 0` (or `--beam 1`) the n-best lists and their scores are ours; with a
length penalty alpha > 0 Transformers ranks finished hypotheses by score / |Y|^alpha where we
use GNMT's ((5 + |Y|) / 6)^alpha (see trainer/serve/__init__.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from data_pipeline.tokenizer import Tokenizer
from model.config import EOS_ID, PAD_ID
from trainer.inference import token_batches
from trainer.serve.optional import require

MAX_LEN_A, MAX_LEN_B = 1.0, 50  # our Translator's limits (model.search defaults)


def pad_sources(ids: list[list[int]], rows: list[int], device: torch.device) -> torch.Tensor:
    """(B, S) PAD-padded sources for the sentences `rows` of `ids` (each ends with EOS)."""
    longest = max(len(ids[i]) for i in rows)
    src = torch.full((len(rows), longest), PAD_ID, dtype=torch.long)  # (B, S)
    for r, i in enumerate(rows):
        src[r, : len(ids[i])] = torch.tensor(ids[i])
    return src.to(device)


def until_eos(row: list[int]) -> list[int]:
    """Generated tokens after the decoder start, up to (not including) the first EOS."""
    row = row[1:]
    return row[: row.index(EOS_ID)] if EOS_ID in row else row


def greedy_scores(sequences: torch.Tensor, logits: tuple[torch.Tensor, ...], lenpen: float) -> list:
    """Sum of log-probabilities of each greedy output (EOS included) / |Y|^lenpen."""
    lprobs = F.log_softmax(torch.stack(logits, dim=1).float(), dim=-1)  # (B, T, V)
    chosen = sequences[:, 1:]  # (B, T)
    token_lp = lprobs.gather(-1, chosen[:, :, None]).squeeze(-1)  # (B, T)
    is_eos = chosen.eq(EOS_ID).long()  # (B, T)
    keep = (is_eos.cumsum(dim=1) - is_eos).eq(0)  # (B, T) up to and including the first EOS
    lengths = keep.sum(dim=1).clamp(min=1).float()  # (B,)
    return ((token_lp * keep).sum(dim=1) / lengths**lenpen).tolist()


@dataclass
class HFTranslator:
    """A MarianMTModel export and our tokenizer over its spm model."""

    model: Any
    tokenizer: Tokenizer
    device: torch.device
    engine: str

    @classmethod
    def load(cls, export_dir: Path, device: str = "cpu") -> HFTranslator:
        transformers = require("transformers")
        model = transformers.MarianMTModel.from_pretrained(str(export_dir)).to(device).eval()
        # Our rules force EOS at each sentence's own limit and keep its log-probability;
        # the batch-wide forced_eos processor (EOS log-prob 0) would change the scores.
        model.generation_config.forced_eos_token_id = None
        engine = f"transformers {transformers.__version__} MarianMTModel ({device})"
        return cls(model, Tokenizer(export_dir / "source.spm"), torch.device(device), engine)

    def generate(self, src: torch.Tensor, beam: int, lenpen: float, nbest: int) -> Any:
        """`generate` on a (B, S) source batch with our rules; the raw generate output."""
        from trainer.serve.hf_rules import rows_max, rules_for

        transformers = require("transformers")
        rules = rules_for(src, beam, MAX_LEN_A, MAX_LEN_B)
        return self.model.generate(
            input_ids=src,
            attention_mask=src.ne(PAD_ID),
            num_beams=beam,
            num_return_sequences=nbest,
            length_penalty=lenpen,
            early_stopping=True,
            do_sample=False,
            max_new_tokens=rows_max(rules),
            logits_processor=transformers.LogitsProcessorList([rules]),
            return_dict_in_generate=True,
            output_scores=beam > 1,
            output_logits=beam == 1,
        )

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
                out = self.generate(pad_sources(ids, chunk, self.device), beam, lenpen, nbest)
                tokens = [until_eos(row) for row in out.sequences.tolist()]  # B * nbest rows
                if beam > 1:
                    scores = out.sequences_scores.tolist()
                else:
                    scores = greedy_scores(out.sequences, out.logits, lenpen)
                texts = self.tokenizer.decode(tokens)
                for r, i in enumerate(chunk):
                    rows = range(r * nbest, (r + 1) * nbest)
                    results[i] = [(texts[j], scores[j]) for j in rows]
        return results
