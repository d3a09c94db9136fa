"""Non-finite losses: train.max_nonfinite consecutive NaN steps stop the run with one clear
line and exit 65; no checkpoint is written from the first NaN step on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.faults.conftest import CONFIG, fault_env, overrides
from trainer.checkpoint.safe_load import forbid_code_in_checkpoints

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXIT_NONFINITE = 65
NAN_FROM = 4
MAX_NONFINITE = 3


def test_consecutive_nan_losses_stop_the_run(synthetic_data: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = overrides(synthetic_data, 30, f"train.max_nonfinite={MAX_NONFINITE}")
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "train", "--config", str(CONFIG), "--nproc", "2",
         "--run-dir", str(run_dir), *args],
        cwd=tmp_path, env=fault_env(nan_from_step=str(NAN_FROM)), capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_NONFINITE, out[-4000:]
    errors = [line for line in proc.stderr.splitlines() if "paperscale: error:" in line]
    assert len(errors) == 1, out[-4000:]
    last_good = f"step_{NAN_FROM - 1:08d}"
    assert f"not finite in {MAX_NONFINITE} consecutive steps" in errors[0]
    assert f"the last checkpoint is {last_good}" in errors[0]
    assert "Traceback" not in out
    ckpt_dir = run_dir / "checkpoints"
    assert (ckpt_dir / "latest").read_text().strip() == last_good
    assert max(p.name for p in ckpt_dir.glob("step_*")) == last_good
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] is not None for r in records if r["step"] < NAN_FROM)
    assert all(r["loss"] is None for r in records if r["step"] >= NAN_FROM)
    # the last checkpoint's weights are finite
    forbid_code_in_checkpoints()
    state = torch.load(ckpt_dir / last_good / "mp_rank_00_model_states.pt", weights_only=True)
    assert all(t.isfinite().all() for t in state["module"].values())
