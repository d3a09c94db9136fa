"""Resume exactness: 2N steps straight equal N steps + resume + N steps, per step, bitwise.

2 ranks, ZeRO 2, gradient accumulation 2, dropout on, the real torchrun + DeepSpeed path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL, paperscale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r.get("loss") is not None}


def train(run_dir: Path, data: Path, max_steps: int, precision: str, cwd: Path) -> None:
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "2",
        "--run-dir", str(run_dir), f"data.dir={data}", *TINY_MODEL,
        "train.grad_accum=2", "train.zero_stage=2", f"train.precision={precision}",
        "train.log_every=1", "train.eval_every=3", "train.save_every=3",
        "train.bleu_samples=4", "logging.wandb=disabled", f"train.max_steps={max_steps}",
        cwd=cwd,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


# fp32 here; bf16 resumes are held bitwise to a straight run by the fault tests
# (tests/integration/faults/test_kill_restart.py: ZeRO 2, dropout, both precisions).
@pytest.mark.parametrize("precision", ["fp32"])
def test_resume_twice_matches_straight_run(
    synthetic_data: Path, tmp_path: Path, precision: str
) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(straight, synthetic_data, 9, precision, tmp_path)
    for stop in (3, 6, 9):  # two resumes
        train(resumed, synthetic_data, stop, precision, tmp_path)
    a, b = losses(straight), losses(resumed)
    assert sorted(a) == sorted(b) == list(range(1, 10))
    assert [a[s] for s in sorted(a)] == [b[s] for s in sorted(b)]  # bitwise
