"""`paperscale export --format ctranslate2`: the Transformers export through CTranslate2.

CTranslate2's `TransformersConverter` reads the MarianMTModel of serve/export_hf.py.
Its Marian loader assumes two things of the Marian checkpoints it was written for, neither of
which holds for ours, so three settings of the converted spec are put back:

- the decoder starts from a zero vector (`start_from_zero_embedding`): Marian's own decoders
  start from the all-zero `<pad>` row; ours starts from BOS's embedding, so the option is off
  and the start token is `<s>` (BOS 2);
- the last vocabulary row is an extra `<pad>` added by the conversion to Transformers, and the
  loader drops the last row of the embedding and output matrices; ours is a real piece (our
  `<pad>` is id 0), so the full shared matrix is restored.

The source side gets `add_source_eos`, so a caller passes the sentencepiece pieces of a
sentence and CTranslate2 appends `</s>` as our tokenizer convention does. Our spm.model is
copied beside model.bin for the text <-> pieces step, and paperscale.json records the
quantization.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

from serve.formats import QUANTIZATIONS
from serve.optional import require
from trainer.run_dir import TOKENIZER


def _converter(hf_dir: Path) -> Any:
    """A TransformersConverter whose spec starts the decoder from BOS and keeps every row."""
    require("transformers")
    require("ctranslate2")
    import ctranslate2.converters as converters

    class OurMarianConverter(converters.TransformersConverter):  # type: ignore[misc,name-defined]
        def load_model(self, model_class: Any, path: str, **kwargs: Any) -> Any:
            self.hf_model = super().load_model(model_class, path, **kwargs)
            return self.hf_model

        def _load(self) -> Any:
            spec = super()._load()
            shared = self.hf_model.model.shared.weight  # (V, D), the full matrix
            spec.encoder.embeddings[0].weight = shared
            spec.decoder.embeddings.weight = shared
            spec.decoder.projection.weight = shared
            spec.decoder.start_from_zero_embedding = False
            spec.config.decoder_start_token = "<s>"
            spec.config.bos_token = "<s>"
            spec.config.add_source_eos = True
            return spec

    return OurMarianConverter(str(hf_dir))


def export_ct2(hf_dir: Path, out_dir: Path, quantization: str = "float32") -> Path:
    """Convert a Transformers export (ours) to a CTranslate2 model directory, replacing it."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}")
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    with warnings.catch_warnings():  # MarianTokenizer's advice to install sacremoses
        warnings.simplefilter("ignore")
        _converter(hf_dir).convert(str(tmp), quantization=quantization, force=True)
    shutil.copyfile(hf_dir / "source.spm", tmp / TOKENIZER)
    (tmp / "paperscale.json").write_text(json.dumps({"quantization": quantization}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
