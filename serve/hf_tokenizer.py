"""Our sentencepiece model as the files of Transformers' MarianTokenizer.

MarianTokenizer is the tokenizer Transformers pairs with MarianMTModel, so `AutoTokenizer`
loads it from the export with no custom code. It splits text with `source.spm` into pieces,
maps each piece to an id through `vocab.json`, and appends `</s>`; it decodes ids back through
`target.spm`. With both spm files our shared model and `vocab.json` its own piece -> id table,
the ids are exactly ours (the text, then EOS 3, no BOS). One difference is left: decoding with
`skip_special_tokens=True` drops `<unk>`, which our tokenizer shows as ` ⁇ `.

A `tokenizer.json` (the Rust `tokenizers` library) is not written: converting a sentencepiece
BPE model into it is Transformers' own conversion, and MarianTokenizer reads the spm model
itself, so what it splits is by construction what our pipeline splits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import sentencepiece as spm

from model.config import PAD_ID, UNK_ID


def piece_vocabulary(spm_model: Path) -> dict[str, int]:
    """Every piece of the model -> its id (ids 0..V-1, specials included)."""
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    return {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}


def write_marian_tokenizer(spm_model: Path, out_dir: Path, max_length: int) -> None:
    """source.spm, target.spm (both our shared model), vocab.json and tokenizer_config.json."""
    vocab = piece_vocabulary(spm_model)
    if vocab.get("<pad>") != PAD_ID or vocab.get("<unk>") != UNK_ID:
        raise ValueError(f"{spm_model}: <pad>/<unk> are not ids {PAD_ID}/{UNK_ID}")
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(spm_model, out_dir / name)
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0))
    config = {
        "tokenizer_class": "MarianTokenizer",
        "unk_token": "<unk>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "separate_vocabs": False,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
