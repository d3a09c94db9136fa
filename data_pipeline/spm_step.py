"""The tokenizer step of `prepare`: a bounded sample of the training split, then
sentencepiece trained on it (in a child process, so its memory goes back to the OS)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from data_pipeline.inputs import PairReader
from data_pipeline.progress import progress_bar
from data_pipeline.tokenizer import train_sentencepiece


def sample_for_spm(
    reader: PairReader, size: int, seed: int, path: Path, progress: bool | None
) -> int:
    """Reservoir-sample ``size`` non-empty sentences (both sides) of the training pairs.

    Bounded memory however large the corpus; the sample is written to ``path`` for
    sentencepiece.  Returns the number of sentences written.
    """
    rng = random.Random(seed)
    reservoir: list[str] = []
    seen = 0
    bar = progress_bar(progress, reader.total_bytes, "spm sample")
    last = 0
    try:
        for n, (src, tgt) in enumerate(reader):
            for text in (src.strip(), tgt.strip()):
                if not text:
                    continue
                seen += 1
                if len(reservoir) < size:
                    reservoir.append(text)
                else:
                    j = rng.randrange(seen)
                    if j < size:
                        reservoir[j] = text
            if n % 4096 == 0:
                pos = reader.raw_pos
                bar.update(pos - last)
                last = pos
    finally:
        bar.close()
    if not reservoir:
        raise ValueError(f"{reader.files[0]}: no non-empty training sentences")
    with open(path, "w", encoding="utf-8") as f:
        for text in reservoir:
            f.write(text.replace("\n", " ") + "\n")
    return len(reservoir)


def train_spm(a: dict[str, Any]) -> tuple[int, float]:
    """Sample the training sentences and train ``out_dir/spm.model``; (sentences, seconds)."""
    started = time.monotonic()
    out_dir = Path(a["out_dir"])
    sample_path = out_dir / ".spm-sample.txt"
    try:
        n = sample_for_spm(
            PairReader([Path(f) for f in a["files"]]),
            a["input_sentence_size"],
            a["seed"],
            sample_path,
            a["progress"],
        )
        train_sentencepiece(
            [sample_path],
            out_dir / "spm",
            a["vocab_size"],
            model_type=a["model_type"],
            input_sentence_size=a["input_sentence_size"],
            seed=a["seed"],
        )
    finally:
        sample_path.unlink(missing_ok=True)
    return n, time.monotonic() - started
