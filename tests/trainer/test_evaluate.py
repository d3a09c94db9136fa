"""Validation BLEU on a real DeepSpeed engine in this process: it decodes exactly the sentences
asked for (not the rest of their batch), and a budget's probe decodes each to its reference's
length (what a trained model's decode costs; an untrained one would run to the length limit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import trainer.validation as evaluate
from data_pipeline.tokenizer import Tokenizer
from launch.config import load_config
from model.config import ModelConfig
from tests.integration.conftest import paperscale
from trainer.dist import DistEnv
from trainer.ds.engine import build_engine
from trainer.settle import tokenizer_path

pytestmark = pytest.mark.xdist_group("step_syncs")  # the worker's one process group

TINY = [
    "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.encoder_layers=1",
    "model.decoder_layers=1", "train.zero_stage=1", "data.max_tokens=2048",
]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("evaluate")
    for args in (
        ("corpus", "synthetic", "corpus", "--train", "400", "--valid", "64", "--test", "8"),
        ("prepare", "corpus", "data", "--vocab-size", "64"),
    ):
        proc = paperscale(*args, cwd=base)
        assert proc.returncode == 0, proc.stderr
    return base / "data"


def decoded_rows(
    monkeypatch: pytest.MonkeyPatch, engine: Any, data: Path, env: DistEnv, **kw: Any
) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """Rows per decoder call, the limits each call got and the lengths it returned, from the
    real greedy search (wrapped to record them)."""
    rows: list[int] = []
    limits: list[list[int]] = []
    lengths: list[list[int]] = []
    real = evaluate.greedy_search

    def recording(model: Any, src: torch.Tensor, **search: Any) -> list[list[int]]:
        out = real(model, src, **search)
        rows.append(src.shape[0])
        lens = search.get("max_lens")
        limits.append([] if lens is None else lens.tolist())
        lengths.append([len(y) for y in out])
        return out

    monkeypatch.setattr(evaluate, "greedy_search", recording)
    job = load_config(None, [*TINY, f"data.dir={data}", "model.vocab_size=64"])
    tokenizer = Tokenizer(tokenizer_path(data))
    out = evaluate.validation_bleu(engine, data, job.data, tokenizer, env, **kw)
    assert "bleu" in out
    return rows, limits, lengths


def test_decodes_the_sentences_asked_for(
    rank_env: DistEnv, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = load_config(None, [*TINY, f"data.dir={data}", "model.vocab_size=64"])
    torch.manual_seed(0)
    engine = build_engine(job, ModelConfig(**job.model.__dict__), rank_env)
    rows, limits, _ = decoded_rows(monkeypatch, engine, data, rank_env, samples=5)
    assert rows == [5] and limits == [[]]  # one batch holds all 64, only 5 are decoded
    rows, limits, lengths = decoded_rows(
        monkeypatch, engine, data, rank_env, samples=7, reference_lengths=True
    )
    assert rows == [7]
    # an untrained model may end early, never late: each output within its reference's length
    assert all(n <= lim - 1 for n, lim in zip(lengths[0], limits[0], strict=True))
    assert min(limits[0]) >= 2 and len(set(limits[0])) > 1  # the references' own lengths
    # far below the default limit (source length + 50) that an untrained model runs to
    assert sum(limits[0]) < 7 * 50
