"""`paperscale export RUN --format paperscale|hf|ctranslate2`: a checkpoint in one serving format.

Every format starts from the same consolidated fp32 weights (trainer/export.py); Transformers
is converted from those, and CTranslate2 from the Transformers export, through its converter.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from serve.formats import CTRANSLATE2, PAPERSCALE, TRANSFORMERS
from trainer.export import export_run
from trainer.run_dir import RunDir

FORMAT_NAMES = {"paperscale": PAPERSCALE, "hf": TRANSFORMERS, "ctranslate2": CTRANSLATE2}


def default_out(run_dir: Path, fmt: str, quantization: str) -> Path:
    """RUN/model, RUN/hf or RUN/ct2-<quantization>."""
    run = RunDir(run_dir)
    if fmt == TRANSFORMERS:
        return run.hf_export
    if fmt == CTRANSLATE2:
        return run.ct2_export(quantization)
    return run.model


def export_run_as(
    run_dir: Path,
    out_dir: Path,
    fmt: str,
    *,
    tag: str | None = None,
    last: int = 1,
    quantization: str = "float32",
) -> list[str]:
    """Export checkpoint `tag` (default: latest), or the average of the last `last`, in format
    `fmt`; returns the tags used."""
    if fmt == PAPERSCALE:
        return export_run(run_dir, out_dir, tag=tag, last=last)
    from serve.export_hf import export_hf

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="paperscale-export-") as tmp:
        ours = RunDir(Path(tmp)).model
        tags = export_run(run_dir, ours, tag=tag, last=last)
        if fmt == TRANSFORMERS:
            export_hf(ours, out_dir)
        else:
            from serve.export_ct2 import export_ct2

            export_hf(ours, RunDir(Path(tmp)).hf_export)
            export_ct2(RunDir(Path(tmp)).hf_export, out_dir, quantization)
    return tags
