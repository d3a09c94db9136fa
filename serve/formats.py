"""Which kind of export a directory holds, from the files that kind always writes."""

from __future__ import annotations

import json
from pathlib import Path


class ExportError(ValueError):
    """An export directory that cannot be loaded; `str()` is one line naming the file."""


PAPERSCALE = "paperscale"  # trainer/export.py: model.safetensors + model.json
TRANSFORMERS = "transformers"  # serve/export_hf.py: a MarianMTModel directory
CTRANSLATE2 = "ctranslate2"  # serve/export_ct2.py: model.bin + shared vocabulary

# CTranslate2 weight types that `paperscale export --quantization` offers (its converter's).
QUANTIZATIONS = (
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)


def export_format(path: Path) -> str | None:
    """PAPERSCALE, TRANSFORMERS or CTRANSLATE2 for an export directory, None for anything else."""
    if (path / "model.safetensors").is_file() and (path / "model.json").is_file():
        return PAPERSCALE
    if (path / "model.bin").is_file() and (path / "shared_vocabulary.json").is_file():
        return CTRANSLATE2
    config = path / "config.json"
    if (path / "model.safetensors").is_file() and config.is_file():
        try:
            model_type = json.loads(config.read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            return None
        return TRANSFORMERS if model_type == "marian" else None
    return None
