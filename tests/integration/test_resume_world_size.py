"""Resume on another number of ranks (2 -> 1 -> 2) through DeepSpeed's universal checkpoint,
keeping the global batch by changing the accumulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL, WORKERS, paperscale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.xdist_group("resume-world-size"),  # one run shared by the module: one worker
]


@pytest.fixture(scope="module")
def sharded_data(synthetic_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic corpus in 4 train shards, so every rank x worker owns whole shards."""
    out = tmp_path_factory.mktemp("sharded") / "data"
    corpus = synthetic_data.parent / "corpus"
    proc = paperscale(
        "prepare", str(corpus), str(out), "--vocab-size", "96", "--shard-samples", "750",
        cwd=out.parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


def train(run_dir: Path, data: Path, nproc: int, max_steps: int, cwd: Path) -> str:
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", str(nproc),
        "--run-dir", str(run_dir), f"data.dir={data}", *TINY_MODEL, WORKERS,
        "train.grad_accum=2", "train.zero_stage=2", "train.precision=fp32",
        "train.log_every=1", "train.eval_every=0", "train.save_every=2",
        "logging.wandb=disabled", "logging.tensorboard=false", f"train.max_steps={max_steps}",
        cwd=cwd,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records}


def test_two_to_one_to_two_ranks(sharded_data: Path, tmp_path: Path) -> None:
    straight, moved = tmp_path / "straight", tmp_path / "moved"
    train(straight, sharded_data, 2, 6, tmp_path)
    train(moved, sharded_data, 2, 2, tmp_path)
    out = train(moved, sharded_data, 1, 4, tmp_path)
    assert "saved on 2 ranks; continuing on 1 with grad_accum 4 (was 2)" in out
    assert "at step 2" in out
    out = train(moved, sharded_data, 2, 6, tmp_path)
    assert "saved on 1 ranks; continuing on 2 with grad_accum 2 (was 4)" in out
    a, b = losses(straight), losses(moved)
    assert sorted(b) == list(range(1, 7))
    assert b[1] == a[1] and b[2] == a[2]  # before the move: the same run
    # After it the micro-batches hold other samples (the shards are re-dealt), the step size
    # and the learning rate are the same: the curve continues.
    for step in range(3, 7):
        assert b[step] == pytest.approx(a[step], rel=0.03)
    converted = [p for p in (moved / "checkpoints" / "universal").iterdir() if p.is_dir()]
    assert converted and all((p / "complete").is_file() for p in converted)
