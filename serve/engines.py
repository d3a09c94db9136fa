"""One loader for every kind of export: our model, Transformers or CTranslate2.

`paperscale translate` and `evaluate` take any export directory; `AnyExport.load` picks the
engine from the files it holds (serve/formats.py); its `.engine` names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serve.formats import CTRANSLATE2, PAPERSCALE, TRANSFORMERS, ExportError, export_format


class AnyExport:
    """`load(export_dir)` -> a translator with `.translate(lines, beam=, lenpen=, nbest=,
    max_tokens=)`, whichever engine the directory is for."""

    @staticmethod
    def load(export_dir: Path, device: str = "cpu") -> Any:
        kind = export_format(export_dir)
        if kind == PAPERSCALE:
            from serve.engine_paperscale import Translator

            return Translator.load(export_dir, device)
        if kind == TRANSFORMERS:
            from serve.engine_hf import HFTranslator

            return _loaded_or_one_line(HFTranslator.load, export_dir, device)
        if kind == CTRANSLATE2:
            from serve.engine_ct2 import CT2Translator

            return _loaded_or_one_line(CT2Translator.load, export_dir, device)
        raise ExportError(f"{export_dir} is not an export directory")


def _loaded_or_one_line(load: Any, export_dir: Path, device: str) -> Any:
    """`load(export_dir, device)`, with any failure of the library as one ExportError line."""
    try:
        return load(export_dir, device)
    except ExportError:
        raise
    except Exception as exc:  # the libraries raise many types for a damaged directory
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise ExportError(f"{export_dir} cannot be loaded: {first[:200]}") from None
