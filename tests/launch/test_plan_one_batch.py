"""`plan` plans the config it is given: by default the step is the config's own tokens per
step, and every time line (time to BLEU, max_steps, a budget's horizon) prices that one batch
and says so, its saves (and, calibrated with data, its evaluations) included; the anchor
follows the recipe (a pre-norm preset is MLPerf's)."""

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
    "configs/synthetic.yaml": "synthetic-90",
}


def seconds(steps: int, step_s: float, save_s: float, save_every: int) -> float:
    """`steps` steps and their saves (the periodic ones before the last step, and the last
    one's): what a run without priced evaluations or start-up spends."""
    saves = (steps - 1) // save_every + 1 if save_every else 1
    return steps * step_s + saves * save_s


@pytest.mark.parametrize("path", PRESETS)
def test_every_time_line_prices_the_configs_own_batch(path: str) -> None:
    job = load_config(ROOT / path)
    own = job.data.max_tokens * job.train.grad_accum * 8
    proc = plan_cli("--config", path, "--gpu", "h100", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["target_tokens_per_side"] == own
    assert plan["target_from"].startswith("config: ")
    tokens, basis = plan["tokens_per_step_per_side"], plan["time_basis"]
    assert abs(tokens / own - 1) <= 0.1  # --batch-tolerance
    assert basis["tokens"] == tokens and basis["batch"] == "configured"
    step_s, save_s, every = basis["step_s"], plan["checkpoint"]["save_s"], job.train.save_every
    assert plan["run_time"]["save_s"] == save_s and not plan["run_time"]["priced"]
    total = seconds(job.train.max_steps, step_s, save_s, every)
    assert plan["total_hours"] == pytest.approx(total / 3600)
    assert plan["max_steps"] == job.train.max_steps
    quality = plan["quality"]
    if path in ANCHOR:
        assert quality["anchor"] == ANCHOR[path]
        need = -(-quality["anchor_tokens"] // tokens)  # ceil
        assert quality["steps"] >= need
        assert quality["steps"] == need or quality["steps"] % job.train.bleu_every == 0
        assert quality["hours"] == pytest.approx(
            seconds(quality["steps"], step_s, save_s, every) / 3600, rel=1e-6, abs=1e-9
        )
    else:
        assert quality is None  # no published (or measured) run of this model to price
    table = plan_cli("--config", path, "--gpu", "h100").stdout
    assert f"time lines       price the configured batch: {tokens:,} tokens per side at " in table
    assert f"at {step_s:.3f} s per step" in table
    if job.train.budget_minutes:  # the budget ends the run, not max_steps
        assert f"train.budget_minutes={job.train.budget_minutes:g}: the run ends at step" in table
        assert "max_steps        " not in table
    else:
        assert f"for train.max_steps={job.train.max_steps:,}, evaluations and saves" in table
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
    assert "time lines       price the recommended batch: 2" in other.stdout
