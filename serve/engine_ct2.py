"""Translation with a CTranslate2 export: `Translator.translate_batch` under our search rules.

Text goes through the export's spm.model with our tokenizer; ids become the model's own token
strings through its shared vocabulary (`</s>` is appended by the model, `add_source_eos`).
Our rules in CTranslate2's terms:

- PAD and BOS never generated: `suppress_sequences=[["<pad>"], ["<s>"]]`;
- EOS allowed from the first step: `min_decoding_length=0` (its default, 1, forbids it there);
- a sentence's limit max_len = floor(src_len + 50) counts the EOS that we force at that step;
  CTranslate2 has one limit per call and ends a hypothesis that reaches it without EOS, so
  each call holds sentences of one limit and asks for `max_len - 1` tokens: the tokens are
  then ours (exactly so in greedy search), but a beam hypothesis that reaches the limit is
  scored without the log-probability of its EOS;
- lengths in the penalty count the EOS (`return_end_token=True`, as Transformers does).

CTranslate2's beam search stops a sentence as ours does with `early_stop` (after `beam`
finished hypotheses) when the length penalty is non-zero; with a zero penalty it stops as soon
as the best candidate of a step is finished, which finds the same best hypothesis as ours with
`early_stop=False`. See serve/__init__.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import torch

from data_pipeline.tokenizer import Tokenizer
from model.config import EOS_ID
from model.search import max_lengths
from serve.engine import MAX_LEN_A, MAX_LEN_B, Engine, Hypotheses, pad_sources
from serve.optional import require
from trainer.run_dir import TOKENIZER

NEVER_GENERATED = [["<pad>"], ["<s>"]]


def compute_type_of(export_dir: Path) -> str:
    """The weight type a CTranslate2 model was saved with (for the engine line)."""
    try:
        saved = json.loads((export_dir / "paperscale.json").read_text())
        return str(saved.get("quantization", "float32"))
    except (OSError, ValueError):
        return "default"


@dataclass
class CT2Translator(Engine):
    """A CTranslate2 model, its vocabulary and our tokenizer over its spm model."""

    model: Any
    vocabulary: list[str]
    tokenizer: Tokenizer
    engine: str
    index: dict[str, int]  # token string -> id: the vocabulary's inverse, built once at load

    @classmethod
    def load(cls, export_dir: Path, device: str = "cpu") -> CT2Translator:
        ctranslate2 = require("ctranslate2")
        threads = torch.get_num_threads() or int(os.environ.get("OMP_NUM_THREADS", "1"))
        model = ctranslate2.Translator(
            str(export_dir), device=device, inter_threads=1, intra_threads=threads
        )
        vocabulary = json.loads((export_dir / "shared_vocabulary.json").read_text())
        engine = (
            f"ctranslate2 {ctranslate2.__version__} ({compute_type_of(export_dir)}, {device}, "
            f"{threads} thread{'s' if threads > 1 else ''})"
        )
        index = {piece: i for i, piece in enumerate(vocabulary)}
        return cls(model, vocabulary, Tokenizer(export_dir / TOKENIZER), engine, index)

    def search_limit(
        self, pieces: list[list[str]], limit: int, beam: int, lenpen: float, nbest: int
    ) -> list[Hypotheses]:
        """translate_batch on sentences of one length limit: each one's n-best (ids, score)."""
        results = self.model.translate_batch(
            pieces,
            beam_size=beam,
            num_hypotheses=nbest,
            length_penalty=lenpen,
            max_decoding_length=max(limit - 1, 1),
            min_decoding_length=0,
            suppress_sequences=NEVER_GENERATED,
            return_end_token=True,
            return_scores=True,
            max_input_length=0,
        )
        out = []
        for result in results:
            hyps = []
            for tokens, score in zip(result.hypotheses, result.scores, strict=True):
                ids = [self.index[t] for t in tokens]
                hyps.append((ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids, score))
            out.append(hyps)
        return out

    def search(
        self, ids: list[list[int]], rows: list[int], beam: int, lenpen: float, nbest: int
    ) -> list[Hypotheses]:
        src = pad_sources(ids, rows, torch.device("cpu"))  # (B, S)
        limits = max_lengths(src, MAX_LEN_A, MAX_LEN_B).tolist()
        found: dict[int, Hypotheses] = {}
        for limit, group in groupby(sorted(zip(limits, rows, strict=True)), key=lambda p: p[0]):
            same = [i for _, i in group]
            pieces = [[self.vocabulary[t] for t in ids[i][:-1]] for i in same]  # no EOS
            hyps = self.search_limit(pieces, limit, beam, lenpen, nbest)
            found.update(zip(same, hyps, strict=True))
        return [found[i] for i in rows]
