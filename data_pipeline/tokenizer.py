"""One shared SentencePiece model for source and target, and a thin batch-oriented wrapper.

The Transformer of the paper shares its embedding matrices between the two languages, so one
subword model is trained on both sides of the training corpus.  The special ids are fixed here
(and duplicated from ``model/config.py`` on purpose: the data pipeline never imports ``model``)
so that token ids written into the shards mean the same thing to the model.
"""

from __future__ import annotations

import gzip
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
SPECIAL_IDS = frozenset({PAD_ID, BOS_ID, EOS_ID})  # stripped by ``Tokenizer.decode`` (UNK is kept)

_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def _plain_copy(path: Path, tmp_dir: Path) -> Path:
    """SentencePiece reads plain files only: decompress a ``.gz`` input into ``tmp_dir``."""
    if path.suffix != ".gz":
        return path
    out = tmp_dir / path.with_suffix("").name
    with gzip.open(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def train_sentencepiece(
    files: list[Path],
    model_prefix: Path,
    vocab_size: int,
    *,
    model_type: str = "bpe",
    input_sentence_size: int = 2_000_000,
    seed: int = 1,
) -> Path:
    """Train one SentencePiece model on ``files`` (both languages) and return ``<prefix>.model``.

    Ids are fixed to pad 0, unk 1, bos 2, eos 3; every character is covered (coverage 1.0)
    and at most ``input_sentence_size`` shuffled sentences are used, so training time is
    bounded on a large corpus.  A corpus too small for ``vocab_size`` raises ``ValueError``
    with one line naming the largest size it allows (sentencepiece computes that number).
    """
    if not files:
        raise ValueError("train_sentencepiece: no input files given")
    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spm-input-") as tmp:
        inputs = [_plain_copy(Path(f), Path(tmp)) for f in files]
        for f in inputs:
            if not f.is_file():
                raise ValueError(f"{f}: tokenizer input file not found")
        spm.set_random_generator_seed(seed)  # sentence sampling/shuffling is reproducible
        try:
            spm.SentencePieceTrainer.train(
                input=",".join(str(f) for f in inputs),
                model_prefix=str(model_prefix),
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=1.0,
                input_sentence_size=input_sentence_size,
                shuffle_input_sentence=True,
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                pad_piece="<pad>",
                unk_piece="<unk>",
                bos_piece="<s>",
                eos_piece="</s>",
                num_threads=2,
                minloglevel=2,
            )
        except RuntimeError as exc:
            raise _training_error(str(exc), vocab_size, files) from None
    return model_prefix.with_suffix(".model")


def _training_error(msg: str, vocab_size: int, files: list[Path]) -> ValueError:
    """sentencepiece's failure as one line: the vocabulary size the corpus allows, if that is
    what went wrong."""
    high = _TOO_HIGH.search(msg)
    if high:
        return ValueError(
            f"corpus too small for vocab_size={vocab_size}: sentencepiece allows at most "
            f"{high.group(2)} pieces for {', '.join(str(f) for f in files)}"
        )
    low = _TOO_LOW.search(msg)
    if low:
        return ValueError(
            f"vocab_size={vocab_size} is below the {low.group(2)} distinct characters "
            "of the corpus (character_coverage=1.0); raise vocab_size"
        )
    return ValueError(f"sentencepiece training failed: {msg.splitlines()[-1]}")


class Tokenizer:
    """A loaded SentencePiece model that encodes and decodes whole batches of sentences."""

    def __init__(self, path: Path | str) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: sentencepiece model not found")
        self.path = path
        self._sp = spm.SentencePieceProcessor(model_file=str(path))
        if (
            self._sp.pad_id() != PAD_ID
            or self._sp.eos_id() != EOS_ID
            or self._sp.bos_id() != BOS_ID
        ):
            raise ValueError(f"{path}: special ids differ from pad 0 / unk 1 / bos 2 / eos 3")

    @property
    def vocab_size(self) -> int:
        """Number of pieces, specials included (the model's embedding rows)."""
        return int(self._sp.get_piece_size())

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Subword ids of each text, without BOS/EOS (callers add the convention they need)."""
        return self._sp.encode(list(texts), out_type=int)

    def decode(self, ids: Sequence[Iterable[int]]) -> list[str]:
        """Detokenised texts, one per row; PAD/BOS/EOS are removed (UNK stays, shown as ``⁇``).

        A row ends at its first EOS (what a decoder emits after EOS is not part of the
        sentence).  Rows may be lists of ints or 1-D tensors/arrays.
        """
        clean: list[list[int]] = []
        for row in ids:
            values = row.tolist() if hasattr(row, "tolist") else [int(i) for i in row]
            out: list[int] = []
            for i in values:
                if i == EOS_ID:
                    break
                if i not in SPECIAL_IDS:
                    out.append(i)
            clean.append(out)
        return self._sp.decode(clean)

    def __getstate__(self) -> dict:
        return {"path": str(self.path)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])
