"""`paperscale export --format hf`: an export directory as a Transformers MarianMTModel.

The output loads with `MarianMTModel.from_pretrained(DIR)` and `MarianTokenizer` /
`AutoTokenizer.from_pretrained(DIR)` and nothing of this project: config.json (MarianConfig),
generation_config.json, model.safetensors (weights mapped by serve/hf_layout.py) and
the tokenizer files of serve/hf_tokenizer.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from model.embedding import sinusoidal_positions
from serve.engine_paperscale import load_exported
from serve.formats import ExportError
from serve.hf_layout import (
    LayoutError,
    generation_defaults,
    marian_config,
    marian_state_dict,
    sin_first_permutation,
)
from serve.hf_tokenizer import write_marian_tokenizer
from serve.optional import require
from trainer.run_dir import TOKENIZER

POSITION_KEYS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def build_marian(export_dir: Path) -> torch.nn.Module:
    """A MarianMTModel holding the weights of one of our export directories, in eval mode."""
    transformers = require("transformers")
    ours = load_exported(export_dir)
    cfg = ours.cfg
    try:
        state = marian_state_dict(ours.state_dict(), cfg)
        config = transformers.MarianConfig(**marian_config(cfg))
    except LayoutError as exc:
        raise ExportError(f"{export_dir}: {exc}") from None
    model = transformers.MarianMTModel(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if sorted(missing) != sorted(POSITION_KEYS) or unexpected:
        raise ExportError(f"MarianMTModel does not take our weights: {missing} {unexpected}")
    perm = sin_first_permutation(cfg.d_model)
    ours_table = sinusoidal_positions(cfg.max_positions, cfg.d_model)[:, perm]  # (P, D)
    for key in POSITION_KEYS:
        if not torch.allclose(model.get_parameter(key), ours_table, rtol=0, atol=1e-6):
            raise ExportError(f"{key} of this transformers version is not our permuted table")
    model.generation_config = transformers.GenerationConfig(**generation_defaults(cfg))
    return model.eval()


def export_hf(export_dir: Path, out_dir: Path) -> Path:
    """Write the Transformers export of `export_dir` (ours) to `out_dir`, replacing it whole.

    Written into a sibling temporary directory first, so a failure leaves `out_dir` as it was.
    """
    model = build_marian(export_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    write_marian_tokenizer(export_dir / TOKENIZER, tmp, model.config.max_position_embeddings)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
