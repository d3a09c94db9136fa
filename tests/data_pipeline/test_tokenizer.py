"""Tokenizer: fixed special ids, lossless round trip, one-line error for a too-small corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_pipeline.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_sentencepiece
from tests.data_pipeline.conftest import VOCAB


def test_round_trip_and_specials(prepared: Path, corpus_dir: Path) -> None:
    tok = Tokenizer(prepared / "spm.model")
    assert tok.vocab_size == VOCAB
    texts = (corpus_dir / "valid.de").read_text().splitlines()[:50]
    texts += ["Kalo mine sushi.", ""]
    ids = tok.encode(texts)
    assert len(ids) == len(texts)
    assert all(PAD_ID not in row and BOS_ID not in row and EOS_ID not in row for row in ids)
    assert tok.decode(ids) == texts
    # Specials anywhere (as the model emits them) are stripped; tensors are accepted too.
    import torch

    noisy = [[BOS_ID, *row, EOS_ID, PAD_ID, PAD_ID] for row in ids]
    assert tok.decode(noisy) == texts
    assert tok.decode([torch.tensor(noisy[0])]) == texts[:1]
    # Decoder output: whatever follows the EOS is not part of the sentence.
    assert tok.decode([[BOS_ID, *ids[0], EOS_ID, *ids[1], PAD_ID]]) == texts[:1]
    assert tok.decode([[BOS_ID, EOS_ID, *ids[1]]]) == [""]
    assert tok._sp.id_to_piece(UNK_ID) == "<unk>"


def test_tokenizer_is_picklable(prepared: Path) -> None:
    import pickle

    tok = pickle.loads(pickle.dumps(Tokenizer(prepared / "spm.model")))
    assert tok.decode(tok.encode(["Su ta ri."])) == ["Su ta ri."]


def test_too_small_corpus_names_the_limit(tmp_path: Path) -> None:
    f = tmp_path / "tiny.txt"
    f.write_text("ka lo mi ne\nsu ta ri po\n" * 20)
    with pytest.raises(ValueError, match=r"too small for vocab_size=5000.*at most \d+") as exc:
        train_sentencepiece([f], tmp_path / "spm", 5000)
    assert "\n" not in str(exc.value)


def test_gz_input(tmp_path: Path, corpus_dir: Path) -> None:
    import gzip

    gz = tmp_path / "train.en.gz"
    gz.write_bytes(gzip.compress((corpus_dir / "train.en").read_bytes()))
    model = train_sentencepiece([gz], tmp_path / "m", 300)
    tok = Tokenizer(model)
    assert tok.vocab_size == 300
    assert tok.decode(tok.encode(["Kalo mi."])) == ["Kalo mi."]
