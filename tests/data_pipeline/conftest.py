"""Shared fixtures: one generated corpus and one prepared data directory per test session.

Tests that damage shards work on a copy (``prepared_copy``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from data_pipeline.config import DataConfig
from data_pipeline.prepare import prepare
from tests.data_pipeline.corpus_gen import make_corpus

VOCAB = 600
MAX_LEN = 64
SHARD_SAMPLES = 500


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("corpus"))


def prepare_test_corpus(
    corpus_dir: Path, out: Path, log: Callable[[str], Any] = lambda _: None, **kw: Any
) -> dict[str, Any]:
    """`prepare` at the settings of the `prepared` fixture (and `kw`); its manifest."""
    return prepare(corpus_dir, out, vocab_size=VOCAB, shard_samples=SHARD_SAMPLES, workers=2,
                   max_len=MAX_LEN, log=log, **kw)  # fmt: skip


@pytest.fixture(scope="session")
def prepared(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 train shards (~2950 pairs), 1 valid shard, 1 test shard (150 pairs each)."""
    out = tmp_path_factory.mktemp("prepared")
    prepare_test_corpus(corpus_dir, out)
    return out


@pytest.fixture
def prepared_copy(prepared: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "data"
    shutil.copytree(prepared, dst)
    return dst


def data_cfg(**kw: object) -> DataConfig:
    """A small-budget config so that an epoch has ~100+ batches."""
    base = {
        "max_tokens": 512,
        "max_len": MAX_LEN,
        "shuffle_buffer": 100,
        "num_workers": 2,
        "bucket_width": 8,
        "pad_multiple": 8,
    }
    base.update(kw)
    return DataConfig(**base)  # type: ignore[arg-type]
