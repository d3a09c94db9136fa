"""Translation with a Transformers export: MarianMTModel.generate under our search rules.

Text goes through the export's own sentencepiece model (`source.spm`, our spm.model) with our
tokenizer, so ids and detokenised text are those of `paperscale translate` on our export.
Search: `generate` with the beam, length penalty and `early_stopping=True` of model/search.py
and `SearchRules` (serve/hf_rules.py) for its token rules and per-sentence length
limits. With `--lenpen 0` (or `--beam 1`) the n-best lists and their scores are ours; with a
length penalty alpha > 0 Transformers ranks finished hypotheses by score / |Y|^alpha where we
use GNMT's ((5 + |Y|) / 6)^alpha (see serve/__init__.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from data_pipeline.tokenizer import Tokenizer
from model.config import EOS_ID, PAD_ID
from serve.engine import MAX_LEN_A, MAX_LEN_B, Engine, Hypotheses, pad_sources
from serve.optional import require


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
class HFTranslator(Engine):
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
        from serve.hf_rules import rows_max, rules_for

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

    def search(
        self, ids: list[list[int]], rows: list[int], beam: int, lenpen: float, nbest: int
    ) -> list[Hypotheses]:
        out = self.generate(pad_sources(ids, rows, self.device), beam, lenpen, nbest)
        tokens = [until_eos(row) for row in out.sequences.tolist()]  # B * nbest rows
        if beam > 1:
            scores = out.sequences_scores.tolist()
        else:
            scores = greedy_scores(out.sequences, out.logits, lenpen)
        pairs = list(zip(tokens, scores, strict=True))
        return [pairs[r * nbest : (r + 1) * nbest] for r in range(len(rows))]
