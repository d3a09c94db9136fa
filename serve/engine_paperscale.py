"""Our own engine: the export's model (trainer/export.py writes it) under model/search.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from data_pipeline.tokenizer import Tokenizer
from model.config import ModelConfig
from model.search import beam_search
from model.transformer import Transformer
from serve.engine import Engine, Hypotheses, pad_sources
from serve.formats import ExportError
from trainer.export import MODEL_JSON, WEIGHTS
from trainer.run_dir import TOKENIZER


def load_exported(export_dir: Path, device: torch.device | str = "cpu") -> Transformer:
    """Build the model from an export directory (safetensors only; nothing is unpickled)."""
    try:
        cfg = ModelConfig(**json.loads((export_dir / MODEL_JSON).read_text()))
        problems = cfg.problems()
    except (OSError, ValueError, TypeError) as exc:
        raise ExportError(f"{export_dir / MODEL_JSON} is not a model description: {exc}") from None
    if problems:
        raise ExportError(f"{export_dir / MODEL_JSON}: {problems[0][0]} {problems[0][1]}")
    model = Transformer(cfg)
    try:
        state = load_file(str(export_dir / WEIGHTS), device=str(device))
    except Exception as exc:  # safetensors raises its own error type for a damaged file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(
            f"{export_dir / WEIGHTS} is not a readable safetensors file ({first})"
        ) from None
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ExportError(
            f"{export_dir / WEIGHTS} does not match {export_dir / MODEL_JSON}: "
            f"{str(exc).strip().splitlines()[-1].strip()[:200]}"
        ) from None
    return model.to(device).eval()


@dataclass
class Translator(Engine):
    """Our export's model and tokenizer; beam search as in training's validation."""

    model: Transformer
    tokenizer: Tokenizer
    device: torch.device

    @classmethod
    def load(cls, export_dir: Path, device: str = "cpu") -> Translator:
        dev = torch.device(device)
        return cls(load_exported(export_dir, dev), Tokenizer(export_dir / TOKENIZER), dev)

    @property
    def engine(self) -> str:
        return f"paperscale (torch {torch.__version__}, {self.device})"

    def search(
        self, ids: list[list[int]], rows: list[int], beam: int, lenpen: float, nbest: int
    ) -> list[Hypotheses]:
        src = pad_sources(ids, rows, self.device)  # (B, S)
        hyps = beam_search(self.model, src, beam=beam, lenpen=lenpen, nbest=nbest)
        return [[(h.tokens, h.score) for h in row] for row in hyps]
