"""A quality target ends the run: `train.target_nll` on 2 real ranks stops at the first
evaluation that reaches it (not before, not after), saves there, records `time_to_target_s` in
the metrics, the summary and `status`; a target never reached runs to max_steps and says so; a
run started again after the target's evaluation ends at once, exporting what is missing. The
BLEU target's logic (scored on rank 0, decided for all) is held in tests/trainer/test_target.py.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL, paperscale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 8


def train(run_dir: Path, data: Path, target_nll: float, cwd: Path) -> str:
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "2",
        "--run-dir", str(run_dir), f"data.dir={data}", *TINY_MODEL,
        "train.zero_stage=1", "train.precision=fp32", "train.log_every=1",
        "train.eval_every=2", "train.save_every=0", "train.bleu_samples=4", "train.bleu_beam=1",
        f"train.target_nll={target_nll!r}", "logging.wandb=disabled",
        "logging.tensorboard=false", f"train.max_steps={STEPS}",
        cwd=cwd,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_target_stops_the_run_at_the_evaluation_that_reaches_it(
    synthetic_data: Path, tmp_path: Path
) -> None:
    never, reached = tmp_path / "never", tmp_path / "reached"
    train(never, synthetic_data, 1e-6, tmp_path)
    summary = json.loads((never / "summary.json").read_text())
    assert summary["target_reached"] is False and summary["steps"] == STEPS
    assert not any("time_to_target_s" in r for r in records(never))
    # the valid NLL at each evaluation of the full run; a target between steps 2's and 4's
    nll = {r["step"]: math.log(r["valid_ppl"]) for r in records(never) if "valid_ppl" in r}
    assert sorted(nll)[:3] == [2, 4, 6] and nll[4] < nll[2]
    target = (nll[2] + nll[4]) / 2
    out = train(reached, synthetic_data, target, tmp_path)
    assert f"target reached at step 4: valid NLL <= {target:g} after " in out
    summary = json.loads((reached / "summary.json").read_text())
    assert summary["target_reached"] is True and summary["target_step"] == 4
    assert summary["steps"] == 4 and summary["time_to_target_s"] > 0
    assert (reached / "checkpoints/latest").read_text().strip() == "step_00000004"
    assert (reached / "model/model.safetensors").is_file()
    got = records(reached)
    assert [r["step"] for r in got if "time_to_target_s" in r] == [4]
    want = {r["step"]: r["loss"] for r in records(never) if "loss" in r and r["step"] <= 4}
    assert {r["step"]: r["loss"] for r in got if "loss" in r} == want  # bitwise, same steps
    status = paperscale("status", str(reached), cwd=tmp_path)
    assert "time to target   " in status.stdout and "(reached at step 4)" in status.stdout
    # started again after the target's evaluation (the export lost, as a kill before it
    # would leave it): it ends at once, trains nothing, and exports the reached checkpoint
    shutil.rmtree(reached / "model")
    out = train(reached, synthetic_data, target, tmp_path)
    assert "resumed from " in out and "at step 4" in out
    assert len(records(reached)) == len(got)  # no step, no evaluation
    assert (reached / "model/model.safetensors").is_file()
    again = json.loads((reached / "summary.json").read_text())
    assert again["target_step"] == 4 and again["time_to_target_s"] == summary["time_to_target_s"]
