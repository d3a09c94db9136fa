"""Transformers and CTranslate2 exports of a model trained by the real trainer (DeepSpeed, 1 CPU
rank, 300 steps on the synthetic task): the same logits, tokens and translations as ours.

Which searches are compared, and why with length penalty 0, is in serve/__init__.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ctranslate2
import pytest
import torch
from transformers import AutoTokenizer, MarianMTModel, MarianTokenizer

from data_pipeline.text import read_split_text
from data_pipeline.tokenizer import Tokenizer
from launch.cli import main
from model.config import BOS_ID, EOS_ID, PAD_ID
from model.search import beam_search, greedy_search
from model.transformer import Transformer
from serve.engine_ct2 import CT2Translator
from serve.engine_hf import HFTranslator
from serve.engine_paperscale import Translator, load_exported
from tests.integration.conftest import ROOT, TINY_MODEL, paperscale
from tests.serve.conftest import marian_logits

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
    pytest.mark.xdist_group("serve-exports"),  # one trained model for the module: one worker
]

N_SENTENCES = 50
MAX_NEW = 100  # one limit for the whole batch, far above any output of this model


@dataclass
class Served:
    run: Path
    hf: Path
    ct2: Path
    ct2_int8: Path
    sources: list[str]
    src: torch.Tensor  # (N, S) our ids, EOS last, PAD after
    ours: Transformer


class ScoredAsCT2(torch.nn.Module):
    """Our model scoring as CTranslate2 does: it removes <pad> and <s> before its softmax, so
    its log-probabilities are renormalised over the other tokens (serve/__init__.py).
    Ours and Transformers' are not. A trained model gives those two tokens little mass, but
    this small one 0.1-0.7 % per step (label smoothing spreads eps / V onto each of the 96
    pieces), which is enough to flip near-ties between its beams; so CTranslate2 is compared
    with our search over the same renormalised distribution."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def encode(self, src: torch.Tensor, padded: bool | None = None) -> object:
        return self.model.encode(src, padded)

    def decode(self, tgt_in: torch.Tensor, enc: object, cache: object = None) -> torch.Tensor:
        logits = self.model.decode(tgt_in, enc, cache)  # type: ignore[arg-type]  # (B, T, V)
        logits[..., [PAD_ID, BOS_ID]] = -torch.inf
        return logits


def translator_scored_as_ct2(run: Path) -> Translator:
    ours = Translator.load(run / "model")
    return dataclasses.replace(ours, model=ScoredAsCT2(ours.model))  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def served(synthetic_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Served:
    """Train, then export in the three formats through the `paperscale` CLI."""
    base = tmp_path_factory.mktemp("serve")
    run = base / "run"
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "1",
        "--run-dir", str(run), f"data.dir={synthetic_data}", *TINY_MODEL,
        "model.d_model=64", "model.d_ff=128", "model.dropout=0.0", "data.max_tokens=1024",
        "optim.lr=0.005", "optim.warmup_steps=30", "train.precision=fp32", "train.max_steps=300",
        "train.grad_accum=1", "train.eval_every=0", "train.save_every=0", "train.bleu_every=0",
        "train.log_every=100", "logging.wandb=disabled", "logging.tensorboard=false",
        cwd=base, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for args in (["--format", "hf"], ["--format", "ctranslate2"],
                 ["--format", "ctranslate2", "--quantization", "int8"]):  # fmt: skip
        assert main(["export", str(run), *args]) == 0
    sources = read_split_text(synthetic_data, "test")[0][:N_SENTENCES]
    ids = [[*s, EOS_ID] for s in Tokenizer(run / "spm.model").encode(sources)]
    src = torch.full((len(ids), max(map(len, ids))), PAD_ID, dtype=torch.long)  # (N, S)
    for i, row in enumerate(ids):
        src[i, : len(row)] = torch.tensor(row)
    ours = load_exported(run / "model")
    return Served(run, run / "hf", run / "ct2-float32", run / "ct2-int8", sources, src, ours)


def hf_tokens(sequences: torch.Tensor) -> list[list[int]]:
    """generate's rows -> tokens after the decoder start, before the first EOS."""
    out = []
    for row in sequences.tolist():
        assert row[0] == BOS_ID
        row = row[1:]
        out.append(row[: row.index(EOS_ID)] if EOS_ID in row else row)
    return out


def test_hf_export_is_plain_marian(served: Served) -> None:
    config = json.loads((served.hf / "config.json").read_text())
    assert config["architectures"] == ["MarianMTModel"] and "auto_map" not in config
    assert config["activation_function"] == "relu" and config["scale_embedding"] is True
    assert config["decoder_start_token_id"] == BOS_ID and config["pad_token_id"] == PAD_ID
    model = MarianMTModel.from_pretrained(served.hf)
    assert not model.final_logits_bias.any()
    assert isinstance(AutoTokenizer.from_pretrained(served.hf), MarianTokenizer)


def test_logits_match_on_padded_batch(served: Served) -> None:
    model = MarianMTModel.from_pretrained(served.hf).eval()
    src = served.src[:8]
    tgt = src.clone()  # any padded target batch: the sources' shapes, BOS first
    tgt[:, 1:], tgt[:, 0] = src[:, :-1], BOS_ID
    tgt[tgt.eq(EOS_ID)] = PAD_ID
    assert tgt.eq(PAD_ID).any() and src.eq(PAD_ID).any()
    with torch.no_grad():
        ours = served.ours(src, tgt)  # (B, T, V)
    assert (ours - marian_logits(model, src, tgt)).abs().max().item() < 1e-4


def test_marian_tokenizer_gives_our_ids_and_text(served: Served) -> None:
    tokenizer = AutoTokenizer.from_pretrained(served.hf)
    batch = tokenizer(served.sources, return_tensors="pt", padding=True)
    assert torch.equal(batch.input_ids, served.src)
    assert torch.equal(batch.attention_mask, served.src.ne(PAD_ID).long())
    outputs = greedy_search(served.ours, served.src)
    ours = Tokenizer(served.run / "spm.model").decode(outputs)
    assert tokenizer.batch_decode(outputs, skip_special_tokens=True) == ours


def test_generate_equals_our_greedy_and_beam_search(served: Served) -> None:
    """Plain `generate` with the export's generation config (forced EOS, PAD and BOS
    suppressed, decoder start BOS), one limit for the batch; beam 4 at length penalty 0.

    Scores are compared for the outputs that end before the limit: at the limit the forced
    EOS counts 0 in Transformers and its own log-probability in ours (a sentence of this
    half-trained model repeats itself until the limit)."""
    model = MarianMTModel.from_pretrained(served.hf).eval()
    src, mask = served.src, served.src.ne(PAD_ID)
    limits = dict(max_len_a=0.0, max_len_b=MAX_NEW)
    with torch.no_grad():
        ours = greedy_search(served.ours, src, **limits)
        theirs = model.generate(input_ids=src, attention_mask=mask, num_beams=1,
                                max_new_tokens=MAX_NEW)  # fmt: skip
        assert hf_tokens(theirs) == ours
        for early in (True, False):
            ours_beam = beam_search(served.ours, src, beam=4, lenpen=0.0, early_stop=early,
                                    **limits)  # fmt: skip
            out = model.generate(input_ids=src, attention_mask=mask, num_beams=4,
                                 length_penalty=0.0, early_stopping=early,
                                 max_new_tokens=MAX_NEW, output_scores=True,
                                 return_dict_in_generate=True)  # fmt: skip
            assert hf_tokens(out.sequences) == [h[0].tokens for h in ours_beam]
            ended = [i for i, h in enumerate(ours_beam) if len(h[0].tokens) < MAX_NEW - 1]
            assert len(ended) >= N_SENTENCES - 5
            expected = torch.tensor([ours_beam[i][0].score for i in ended])
            assert torch.allclose(out.sequences_scores[ended], expected, atol=1e-4)


def test_transformers_engine_equals_our_translator(served: Served) -> None:
    """Our defaults (per-sentence limits) through `SearchRules`: n-best lists and scores."""
    ours = Translator.load(served.run / "model")
    theirs = HFTranslator.load(served.hf)
    for beam, nbest in ((1, 1), (4, 4)):
        a = ours.translate(served.sources, beam=beam, lenpen=0.0, nbest=nbest)
        b = theirs.translate(served.sources, beam=beam, lenpen=0.0, nbest=nbest)
        assert [[t for t, _ in row] for row in a] == [[t for t, _ in row] for row in b]
        if beam > 1:
            scores_a = [score for row in a for _, score in row]
            scores_b = [score for row in b for _, score in row]
            assert max(abs(x - y) for x, y in zip(scores_a, scores_b, strict=True)) < 1e-4


def test_ctranslate2_fp32_equals_our_search(served: Served) -> None:
    """translate_batch greedy and beam 4 (length penalty 0 stops at the first finished best
    candidate, ours with early_stop=False), one limit for the batch.

    CTranslate2 cuts a hypothesis at its limit where ours forces EOS one step later, hence
    `MAX_NEW - 1`; beam outputs that reach the limit are left out (their EOS term is missing
    from CTranslate2's score)."""
    translator = ctranslate2.Translator(str(served.ct2), device="cpu", intra_threads=1)
    vocab = json.loads((served.ct2 / "shared_vocabulary.json").read_text())
    index = {piece: i for i, piece in enumerate(vocab)}
    pieces = [[vocab[t] for t in row if t not in (PAD_ID, EOS_ID)] for row in served.src.tolist()]
    limits = dict(max_len_a=0.0, max_len_b=MAX_NEW)
    ours = ScoredAsCT2(served.ours)
    with torch.no_grad():
        greedy = greedy_search(ours, served.src, **limits)  # type: ignore[arg-type]
        beam = [h[0].tokens for h in beam_search(ours, served.src, beam=4, lenpen=0.0,  # type: ignore[arg-type]
                                                 early_stop=False, **limits)]  # fmt: skip
    ended = [i for i, tokens in enumerate(beam) if len(tokens) < MAX_NEW - 1]
    assert len(ended) >= N_SENTENCES - 5
    for size, expected, rows in ((1, greedy, range(N_SENTENCES)), (4, beam, ended)):
        results = translator.translate_batch(
            pieces, beam_size=size, length_penalty=0.0, max_decoding_length=MAX_NEW - 1,
            min_decoding_length=0, suppress_sequences=[["<pad>"], ["<s>"]],
        )  # fmt: skip
        got = [[index[t] for t in r.hypotheses[0]] for r in results]
        assert [got[i] for i in rows] == [expected[i] for i in rows]


def test_ctranslate2_engine_equals_our_translator(served: Served) -> None:
    ours = translator_scored_as_ct2(served.run)
    theirs = CT2Translator.load(served.ct2)
    for beam in (1, 4):
        a = ours.translate(served.sources, beam=beam, lenpen=0.0)
        b = theirs.translate(served.sources, beam=beam, lenpen=0.0)
        assert [row[0][0] for row in a] == [row[0][0] for row in b]


def test_ctranslate2_int8_translates(served: Served) -> None:
    int8 = CT2Translator.load(served.ct2_int8)
    assert "int8" in int8.engine
    rows = int8.translate(served.sources, beam=4)
    assert len(rows) == N_SENTENCES and all(len(r) == 1 and r[0][0] for r in rows)


@pytest.mark.parametrize(("export", "engine"), [("hf", "transformers"), ("ct2", "ctranslate2")])
def test_translate_cli_names_the_engine(
    served: Served, export: str, engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in served.sources))
    args = ["--input", str(tmp_path / "in.txt"), "--lenpen", "0"]
    assert main(["translate", str(served.run), *args]) == 0
    ours = capsys.readouterr()
    assert ours.err.strip().splitlines() == [ours.err.strip()]
    assert ours.err.startswith("paperscale: engine: paperscale")
    assert main(["translate", str(getattr(served, export)), *args]) == 0
    theirs = capsys.readouterr()
    assert theirs.err.strip().splitlines() == [theirs.err.strip()]
    assert theirs.err.startswith(f"paperscale: engine: {engine}")
    assert len(ours.out.splitlines()) == N_SENTENCES
    if export == "hf":
        assert theirs.out == ours.out
    else:  # what our translator gives when it scores as CTranslate2 does (ScoredAsCT2)
        same = translator_scored_as_ct2(served.run).translate(served.sources, beam=4, lenpen=0.0)
        assert theirs.out.splitlines() == [row[0][0] for row in same]
