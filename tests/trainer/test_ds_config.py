import pytest

from trainer.config import OptimConfig, TrainConfig
from trainer.ds_config import build_ds_config


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_stage_accumulation_and_batch(stage: int) -> None:
    cfg = build_ds_config(TrainConfig(zero_stage=stage, grad_accum=4), OptimConfig(), world_size=2)
    assert cfg["zero_optimization"]["stage"] == stage
    assert cfg["gradient_accumulation_steps"] == 4
    assert cfg["train_batch_size"] == 8  # micro 1 x accum 4 x world 2
    assert cfg["zero_optimization"]["reduce_bucket_size"] > 0
    assert ("stage3_prefetch_bucket_size" in cfg["zero_optimization"]) == (stage == 3)


def test_precisions() -> None:
    bf16 = build_ds_config(TrainConfig(precision="bf16"), OptimConfig(), 1)
    assert bf16["bf16"] == {"enabled": True} and "fp16" not in bf16
    fp16 = build_ds_config(TrainConfig(precision="fp16"), OptimConfig(), 1)
    assert fp16["fp16"]["enabled"] and fp16["fp16"]["loss_scale"] == 0
    assert fp16["fp16"]["min_loss_scale"] >= 1
    fp32 = build_ds_config(TrainConfig(precision="fp32"), OptimConfig(), 1)
    assert "bf16" not in fp32 and "fp16" not in fp32


def test_clipping_follows_config() -> None:
    assert build_ds_config(TrainConfig(), OptimConfig(), 1)["gradient_clipping"] == 0.0
    assert build_ds_config(TrainConfig(), OptimConfig(clip_grad=1.0), 1)["gradient_clipping"] == 1.0
