"""The real trainer learns: 2 CPU ranks reach a clear BLEU on held-out synthetic sequences.

A CI-sized version of the synthetic_task bench (configs/bench/synthetic_task.yaml, which checks
the full task: 5-20 tokens, BLEU >= 90 within 10 minutes): mapped reversal of 3-10
pseudo-words from a 50-word vocabulary, written by the synthetic corpus writer, then the real
`paperscale prepare`, `train --nproc 2` (torchrun, DeepSpeed ZeRO 2, precision auto) and
`evaluate` on the test split. Chance BLEU is ~0; the threshold leaves a wide margin below what
the run reaches.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from data_pipeline.corpus import write_synthetic
from tests.integration.conftest import paperscale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

MIN_BLEU = 60.0
TRAIN = [
    "model.d_model=128",
    "model.n_heads=4",
    "model.d_ff=512",
    "model.encoder_layers=2",
    "model.decoder_layers=2",
    "model.dropout=0.0",
    "data.max_tokens=1024",
    "data.max_len=32",
    "data.shuffle_buffer=2000",
    "optim.lr=0.002",
    "optim.warmup_steps=100",
    "train.max_steps=400",
    "train.grad_accum=1",
    "train.zero_stage=2",
    "train.precision=auto",  # what a user gets: bf16 only where this machine runs it natively
    "train.log_every=50",
    "train.eval_every=0",
    "train.bleu_samples=100",
    "train.save_every=0",
    "train.keep_last=1",
    "logging.wandb=disabled",
    "logging.tensorboard=false",
    "logging.report=false",
]


def test_two_ranks_learn_synthetic_reversal(tmp_path: Path) -> None:
    corpus, data, run_dir = tmp_path / "corpus", tmp_path / "data", tmp_path / "run"
    write_synthetic(
        corpus, n_train=8000, n_valid=100, n_test=200, seed=3, vocab=50, min_len=3, max_len=10
    )
    proc = paperscale("prepare", str(corpus), str(data), "--vocab-size", "300", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr

    start = time.perf_counter()
    proc = paperscale(
        "train",
        "--config",
        str(ROOT / "configs/synthetic.yaml"),
        "--nproc",
        "2",
        "--run-dir",
        str(run_dir),
        f"data.dir={data}",
        *TRAIN,
        cwd=tmp_path,
        timeout=360,
    )
    train_s = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 400
    assert summary["valid_loss"] < summary["first_loss"] / 2

    evaluate = ["evaluate", str(run_dir), "--data", str(data), "--split", "test", "--beam", "4"]
    proc = paperscale(*evaluate, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run_dir / "eval_test.json").read_text())
    print(f"train {train_s:.0f} s, {summary['steps']} steps, test BLEU {result['bleu']:.2f}")
    assert result["sentences"] == 200
    assert result["bleu"] >= MIN_BLEU, result
