"""Two runs of one config, seed and data on one machine give bitwise-equal losses: 2 ranks,
ZeRO 2, accumulation, dropout, every `auto` left to the machine, one run idle and one beside
four busy processes with `train.deterministic` (the CPU twin of the CUDA setting); one rank on
two threads, idle and loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common import busy_processes
from tests.integration.conftest import (
    TINY_MODEL,
    assert_same_decisions,
    decided,
    logged_losses,
    paperscale,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
STEPS = 4


def train(
    run_dir: Path, data: Path, cwd: Path, *extra: str, nproc: int = 2, threads: int = 1
) -> str:
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", str(nproc),
        "--run-dir", str(run_dir), f"data.dir={data}", *TINY_MODEL,
        "train.grad_accum=2", "train.zero_stage=2", "train.precision=auto",
        "train.attention=auto", "train.log_every=1", "train.eval_every=0",
        "train.save_every=0", "train.bleu_samples=4", "train.bleu_beam=1",
        "logging.wandb=disabled", "logging.tensorboard=false", f"train.max_steps={STEPS}",
        *extra,
        cwd=cwd, env={"OMP_NUM_THREADS": str(threads)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_runs_idle_loaded_and_deterministic_give_the_same_losses(
    synthetic_data: Path, tmp_path: Path
) -> None:
    idle = tmp_path / "idle"
    out = train(idle, synthetic_data, tmp_path)
    assert "precision auto -> " in out and "attention auto -> " in out
    loaded = tmp_path / "loaded"
    with busy_processes(4):  # and with train.deterministic, which changes nothing on a CPU
        train(loaded, synthetic_data, tmp_path, "train.deterministic=true")
    reference = logged_losses(idle)
    assert len(reference) == STEPS
    assert_same_decisions(loaded, idle)
    assert logged_losses(loaded) == reference  # bitwise
    assert set(decided(idle)) == {
        "device", "precision", "attention", "grad_accum_dtype", "compile", "num_workers"
    }  # fmt: skip


def test_one_rank_on_two_threads_idle_and_loaded_gives_the_same_losses(
    synthetic_data: Path, tmp_path: Path
) -> None:
    idle, loaded = tmp_path / "idle", tmp_path / "loaded"
    train(idle, synthetic_data, tmp_path, nproc=1, threads=2)
    with busy_processes(4):
        train(loaded, synthetic_data, tmp_path, nproc=1, threads=2)
    assert_same_decisions(loaded, idle)
    reference = logged_losses(idle)
    assert len(reference) == STEPS and logged_losses(loaded) == reference  # bitwise
