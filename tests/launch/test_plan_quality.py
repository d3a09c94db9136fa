"""Time to a target quality: the anchors' token budgets, the anchor `plan` picks, steps and
hours at the planned step, the step time with its overhead, and the lines `plan` prints."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from launch.cost_model.plan import Machine, make_plan, step_time
from launch.cost_model.quality import ANCHORS, Anchor, model_kind, pick_anchor, time_to_quality
from model.config import ModelConfig
from tests.launch.conftest import plan_cli

ROOT = Path(__file__).resolve().parents[2]
BIG = ModelConfig(vocab_size=37000, d_model=1024, n_heads=16, d_ff=4096)
BASE = ModelConfig(vocab_size=37000)
TINY = ModelConfig(vocab_size=8000, d_model=256, n_heads=4, d_ff=1024, encoder_layers=3)
ANCHOR = {a.name: a for a in ANCHORS}


def test_anchor_budgets() -> None:
    assert ANCHOR["paper-base"].tokens == 100_000 * 25_000
    assert ANCHOR["paper-big"].tokens == 300_000 * 25_000
    assert ANCHOR["mlperf-v0.7"].tokens == 3_632 * 8 * 13_824
    assert ANCHOR["fairseq-scaling"].tokens == 24_000 * 8 * 3_584 * 16
    assert ANCHOR["synthetic-90"].tokens == 800 * 2 * 2_048  # configs/synthetic.yaml's step
    assert {a.bleu for a in ANCHORS} == {27.3, 28.4, 25.0, 29.3, 90.0}


def test_the_anchor_of_the_same_recipe_nearest_the_planned_step_is_picked() -> None:
    """The layer norm placement first (a pre-norm big model is MLPerf's recipe), then the
    batch nearest the planned step."""
    assert model_kind(BIG) == "big" and model_kind(BASE) == "base" and model_kind(TINY) is None
    synthetic = ModelConfig(vocab_size=300, d_model=128, n_heads=4, d_ff=512, encoder_layers=2,
                            decoder_layers=2)  # fmt: skip
    assert model_kind(synthetic) == "synthetic"
    assert pick_anchor(synthetic, 4_096).name == "synthetic-90"
    # the same shape on another vocabulary is another task: no anchor
    assert model_kind(dataclasses.replace(synthetic, vocab_size=8000)) is None
    assert pick_anchor(BIG, 25_000).name == "paper-big"
    assert pick_anchor(BIG, 32_768).name == "paper-big"
    assert pick_anchor(BIG, 110_592).name == "fairseq-scaling"  # post-norm, as the config
    pre_norm = ModelConfig(vocab_size=37000, d_model=1024, n_heads=16, d_ff=4096, pre_norm=True)
    assert pick_anchor(pre_norm, 110_592).name == "mlperf-v0.7"
    assert pick_anchor(pre_norm, 25_000).name == "mlperf-v0.7"
    assert pick_anchor(BIG, 458_752).name == "fairseq-scaling"
    assert pick_anchor(BIG, 2_000_000).name == "fairseq-scaling"
    assert pick_anchor(BASE, 458_752).name == "paper-base"
    assert pick_anchor(TINY, 6144) is None
    assert pick_anchor(BIG, 25_000, "fairseq-scaling").name == "fairseq-scaling"
    with pytest.raises(ValueError, match="big model"):
        pick_anchor(BASE, 25_000, "mlperf-v0.7")
    with pytest.raises(ValueError, match="no anchor"):
        pick_anchor(BIG, 25_000, "nonesuch")


@pytest.mark.parametrize("anchor", ANCHORS, ids=lambda a: a.name)
@pytest.mark.parametrize("scale", [0.5, 1.0, 3.0])
def test_steps_are_the_anchors_tokens_over_the_step(anchor: Anchor, scale: float) -> None:
    step_tokens = int(anchor.batch_tokens * scale)
    q = time_to_quality(anchor, step_tokens, step_s=0.5, pre_norm=False)
    assert q["steps"] == math.ceil(anchor.tokens / step_tokens)
    assert q["hours"] == pytest.approx(q["steps"] * 0.5 / 3600)
    if scale == 1.0:
        assert q["steps"] == anchor.steps


def test_step_time_adds_the_overheads_per_step_and_per_micro_batch() -> None:
    m = Machine(gpus_per_node=8, mfu=0.5, peak_flops=1e15, overhead_s=0.01, overhead_micro_s=0.002)
    one = step_time(BIG, m, 458_752, 32, accum=1)
    four = step_time(BIG, m, 458_752, 32, accum=4)
    assert one["compute_s"] == pytest.approx(one["flops"] / (8 * 1e15 * 0.5))
    assert one["step_s"] == pytest.approx(one["compute_s"] + 0.012)
    assert four["step_s"] - one["step_s"] == pytest.approx(3 * 0.002)
    assert step_time(BIG, m, 458_752, 32, fill=0.5)["compute_s"] == pytest.approx(
        one["compute_s"] / 2
    )
    plan = make_plan(BIG, m, target_tokens=458_752)
    assert plan["step_s"] == pytest.approx(plan["compute_s"] + 0.01 + plan["grad_accum"] * 0.002)


def test_cli_prints_the_time_to_bleu_and_its_reasoning() -> None:
    args = ("--config", "configs/big_8gpu.yaml", "--gpu", "h200", "--target-tokens", "config")
    proc = plan_cli(*args)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "target           458,752 tokens per side per step (config: 14,336 x 4 x 8 ranks)" in out
    assert "H200: MFU 0.235 of its 989 TFLOP/s peak measured end to end (eager;" in out
    # ZeRO 0's 2.2 ms all-reduce, all but its last 5e7-element bucket behind the backward
    assert "gradient sync    0.5 ms per step: ZeRO 0 moves 0.75 GB per rank (bf16) over NVL" in out
    assert "time to BLEU     29.3 (fairseq-scaling: Ott et al. 2018" in out
    assert "/ 458,752 per step = 24,000 steps ->" in out
    assert "as configured    14,336 x 4 x 8 ranks = 458,752 tokens per side at ZeRO 1 (fits" in out
    plan = json.loads(plan_cli(*args, "--json").stdout)
    assert plan["quality"]["steps"] == 24_000 and plan["speed_measured"] is True
    # its steps at the configured batch (the recommended one's tokens) and its saves
    basis, rt = plan["time_basis"], plan["run_time"]
    assert basis["batch"] == "configured" and basis["tokens"] == 458_752
    saves = (24_000 - 1) // rt["save_every"] + 1
    want = 24_000 * basis["step_s"] + saves * rt["save_s"]
    assert plan["quality"]["hours"] == pytest.approx(want / 3600)
    assert plan["step_s"] == pytest.approx(plan["compute_s"] + plan["comm_s"])
    last_bucket = 50_000_000 / 214_245_376
    assert plan["mfu"] == 0.235 and plan["comm_s"] == pytest.approx(0.00215 * last_bucket, rel=0.01)
    assert plan["micro_tokens"] == 57_344 and plan["grad_accum"] == 1  # 141 GiB hold the share


def test_cli_paper_batch_uses_the_papers_anchor_and_other_anchors_on_request() -> None:
    plan = json.loads(plan_cli("--config", "configs/big.yaml", "--gpu", "h100", "--json").stdout)
    tokens = plan["tokens_per_step_per_side"]
    assert plan["quality"]["anchor"] == "paper-big"
    assert plan["quality"]["steps"] == math.ceil(300_000 * 25_000 / tokens)
    named = plan_cli("--config", "configs/big.yaml", "--anchor", "mlperf-v0.7", "--json")
    assert json.loads(named.stdout)["quality"]["anchor"] == "mlperf-v0.7"
    tiny = plan_cli("--config", "configs/tiny.yaml", "--gpus-per-node", "2")
    assert "time to BLEU     no anchor for this model" in tiny.stdout


@pytest.mark.parametrize(
    "bad, needle",
    [
        (["--anchor", "paper-base"], "--anchor"),
        (["--target-tokens", "lots"], "--target-tokens"),
        (["--fill", "0"], "--fill"),
        (["--overhead-ms", "-1"], "--overhead-ms"),
        (["--batch-tolerance", "1"], "--batch-tolerance"),
    ],
)
def test_cli_bad_args_exit_2_one_line(bad: list[str], needle: str) -> None:
    proc = plan_cli("--config", "configs/big.yaml", *bad)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


def test_a_measured_gpu_uses_its_measured_mfu_unless_told_otherwise() -> None:
    """H200 was measured by the `gpu` bench (bench/RESULTS.md): eager and compiled MFU, no
    all-reduce on one GPU; --mfu or --overhead-ms go back to the assumed model."""
    base = ("--config", "configs/big.yaml", "--gpu", "h200", "--nodes", "1", "--json")
    one = json.loads(plan_cli(*base, "--gpus-per-node", "1").stdout)
    assert one["speed_measured"] is True and one["mfu"] == 0.235
    assert one["step_s"] == pytest.approx(one["compute_s"])  # no all-reduce on one GPU
    compiled = json.loads(plan_cli(*base, "--gpus-per-node", "1", "train.compile=true").stdout)
    assert compiled["mfu"] == 0.319
    told = json.loads(plan_cli(*base, "--mfu", "0.5").stdout)
    assert told["speed_measured"] is False and told["mfu"] == 0.5


@pytest.mark.parametrize(("gpu", "peak"), [("h100", 989.0), ("a100", 312.0), ("l4", 121.0)])
def test_an_unmeasured_gpu_is_planned_from_the_measured_one_by_the_ratio_of_peaks(
    gpu: str, peak: float
) -> None:
    """No `gpu` bench on it: the H200's end-to-end MFU at its own peak, marked as not
    measured; the same work then takes the H200's compute time x 989 / peak."""
    base = ("--config", "configs/big.yaml", "--nodes", "1", "--gpus-per-node", "1", "--json")
    got = json.loads(plan_cli(*base, "--gpu", gpu, "--gpu-mem", "80").stdout)
    h200 = json.loads(plan_cli(*base, "--gpu", "h200", "--gpu-mem", "80").stdout)
    assert got["speed_measured"] is False and got["mfu"] == 0.235
    assert got["peak_tflops"] == pytest.approx(peak)
    assert "planned from H200's measured MFU 0.235" in got["speed_line"]
    assert got["tokens_per_step_per_side"] == h200["tokens_per_step_per_side"]
    assert got["compute_s"] == pytest.approx(h200["compute_s"] * 989.0 / peak)
    compiled = json.loads(plan_cli(*base, "--gpu", gpu, "train.compile=true").stdout)
    assert compiled["mfu"] == 0.319
    # fp16 (V100): nothing measured in that precision, the assumed model
    v100 = json.loads(plan_cli(*base, "--gpu", "v100").stdout)
    assert v100["mfu"] == 0.4 and "assumed peak 125 TFLOP/s" in v100["speed_line"]
