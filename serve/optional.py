"""Imports of the `serve` extra (transformers, ctranslate2), with one clear line when absent."""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

from serve.formats import ExportError


class MissingExtra(ExportError):
    """A serve library is not installed; `str()` says how to install it."""


def require(name: str) -> ModuleType:
    """Import `transformers` or `ctranslate2`, quietly: their progress and advice lines would
    otherwise mix with the command's own output."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = importlib.import_module(name)
    except ImportError:
        raise MissingExtra(
            f"{name} is not installed; install the serve extra: pip install -e '.[serve]'"
        ) from None
    if name == "transformers":
        module.logging.set_verbosity_error()
        module.utils.logging.disable_progress_bar()
    return module
