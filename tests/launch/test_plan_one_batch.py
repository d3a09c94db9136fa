"""`plan` plans the config it is given: by default the step is the config's own tokens per
step, and every time line (step time, time to BLEU, max_steps) prices that one batch and says
so; the anchor follows the recipe (a pre-norm preset is MLPerf's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.config import load_config
from tests.launch.conftest import plan_cli

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*.yaml"))
# the anchor each preset of the paper's shapes is planned against, by default
ANCHOR = {
    "configs/base.yaml": "paper-base",
    "configs/big.yaml": "paper-big",
    "configs/base_8gpu.yaml": "paper-base",  # pre-norm base: no published pre-norm base run
    "configs/big_8gpu.yaml": "fairseq-scaling",
    "configs/big_mlperf_8gpu.yaml": "mlperf-v0.7",
}


@pytest.mark.parametrize("path", PRESETS)
def test_every_time_line_prices_the_configs_own_batch(path: str) -> None:
    job = load_config(ROOT / path)
    own = job.data.max_tokens * job.train.grad_accum * 8
    proc = plan_cli("--config", path, "--gpu", "h100", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["target_tokens_per_side"] == own
    assert plan["target_from"].startswith("config: ")
    tokens, step_s = plan["tokens_per_step_per_side"], plan["step_s"]
    assert abs(tokens / own - 1) <= 0.1  # --batch-tolerance
    assert plan["total_hours"] == pytest.approx(job.train.max_steps * step_s / 3600)
    assert plan["max_steps"] == job.train.max_steps
    quality = plan["quality"]
    if path in ANCHOR:
        assert quality["anchor"] == ANCHOR[path]
        assert (
            quality["steps"] * tokens >= quality["anchor_tokens"] > (quality["steps"] - 1) * tokens
        )
        assert quality["hours"] == pytest.approx(quality["steps"] * step_s / 3600)
    else:
        assert quality is None  # not the paper's shapes: no published run to price
    table = plan_cli("--config", path, "--gpu", "h100").stdout
    assert f"step time        {step_s:.3f} s per recommended step ({tokens:,} tokens" in table
    assert f"at {step_s:.3f} s per recommended step" in table
    if path in ANCHOR:
        assert f"/ {tokens:,} per step = {quality['steps']:,} steps" in table


def test_the_mlperf_preset_is_planned_as_mlperf_ran_it() -> None:
    """The case that planned another recipe: 8 x 13,824 tokens, MLPerf's 3,632 steps to 25.0."""
    path = "configs/big_mlperf_8gpu.yaml"
    plan = json.loads(plan_cli("--config", path, "--gpu", "h200", "--json").stdout)
    assert plan["tokens_per_step_per_side"] == 110_592 and plan["grad_accum"] == 1
    assert plan["quality"]["anchor"] == "mlperf-v0.7" and plan["quality"]["steps"] == 3_632
    assert plan["quality"]["bleu"] == 25.0 and not plan["quality"]["norm_differs"]
    # a number still plans another batch, and the lines say which one they price
    other = plan_cli("--config", path, "--gpu", "h200", "--target-tokens", "25000")
    assert "; the lines below price the recommended 2" in other.stdout
