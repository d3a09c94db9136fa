"""The large-batch presets for one 8-GPU node: each loads through the config loader without a
problem, implies the step of the recipe it follows, and `plan` keeps that step and finds the
anchor it came from."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from launch.config import JobConfig, load_config
from launch.cost_model.plan import Machine, make_plan
from launch.cost_model.quality import ANCHORS, model_kind, pick_anchor
from model.config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
ANCHOR = {a.name: a for a in ANCHORS}
# preset: (tokens per side per step on 8 GPUs, model, the anchor its steps come from)
PRESETS = {
    "configs/big_8gpu.yaml": (458_752, "big", "fairseq-scaling"),
    "configs/big_mlperf_8gpu.yaml": (110_592, "big", "mlperf-v0.7"),
    "configs/base_8gpu.yaml": (110_592, "base", "paper-base"),
}


def _model(job: JobConfig) -> ModelConfig:
    """The preset's model with its data's vocabulary, as `plan` builds it."""
    return ModelConfig(**{**job.model.__dict__, "vocab_size": job.data.vocab_size})


@pytest.mark.parametrize("path", sorted(PRESETS))
def test_preset_loads_validates_and_implies_its_step(path: str) -> None:
    step_tokens, kind, anchor = PRESETS[path]
    job = load_config(ROOT / path)  # raises ConfigError on the first problem
    for section in (job.model, job.data, job.optim, job.train, job.logging, job.profile):
        assert section.problems() == []
    assert job.data.max_tokens * job.train.grad_accum * 8 == step_tokens
    assert job.data.max_tokens % 256 == 0 and job.data.max_tokens >= job.data.max_len
    assert model_kind(_model(job)) == kind
    # the run is as long as the anchor's token budget at this step
    assert job.train.max_steps == math.ceil(ANCHOR[anchor].tokens / step_tokens)
    assert job.run.name == Path(path).stem


def test_fairseq_recipe() -> None:
    job = load_config(ROOT / "configs/big_8gpu.yaml")
    o = job.optim
    assert (o.lr, o.warmup_steps, o.warmup_init_lr, o.schedule) == (
        1e-3,
        4000,
        1e-7,
        "inverse_sqrt",
    )
    assert (o.beta1, o.beta2) == (0.9, 0.98)
    assert job.model.dropout == 0.3 and not job.model.pre_norm
    assert 3584 * 16 * 8 == 458_752  # fairseq's --max-tokens x --update-freq x GPUs


@pytest.mark.parametrize("path", ["configs/big_mlperf_8gpu.yaml", "configs/base_8gpu.yaml"])
def test_mlperf_schedule(path: str) -> None:
    job = load_config(ROOT / path)
    o = job.optim
    assert (o.lr, o.warmup_steps, o.warmup_init_lr, o.schedule) == (
        1.9e-3,
        750,
        0.0,
        "inverse_sqrt",
    )
    assert (o.beta1, o.beta2, o.eps) == (0.9, 0.98, 1e-9)
    assert job.model.pre_norm and job.model.dropout == 0.1
    assert job.data.max_tokens == 13_824 and job.train.grad_accum == 1


@pytest.mark.parametrize("path", sorted(PRESETS))
@pytest.mark.parametrize("gpu_mem", [40.0, 80.0, 141.0])
def test_plan_keeps_the_presets_step_and_finds_its_anchor(path: str, gpu_mem: float) -> None:
    step_tokens, _, anchor = PRESETS[path]
    job = load_config(ROOT / path)
    cfg = _model(job)
    plan = make_plan(cfg, Machine(gpus_per_node=8, gpu_mem_gib=gpu_mem), target_tokens=step_tokens)
    assert plan["tokens_per_step_per_side"] == step_tokens  # one share per GPU fits
    assert plan["grad_accum"] == 1 and plan["micro_tokens"] == step_tokens // 8
    found = pick_anchor(cfg, plan["tokens_per_step_per_side"])
    assert found is not None and found.name == anchor
