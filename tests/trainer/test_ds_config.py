import pytest

from trainer.config import OptimConfig, TrainConfig
from trainer.ds.config import build_ds_config


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
    assert bf16["bf16"]["enabled"] and "fp16" not in bf16
    fp16 = build_ds_config(TrainConfig(precision="fp16"), OptimConfig(), 1)
    assert fp16["fp16"]["enabled"] and fp16["fp16"]["loss_scale"] == 0
    assert fp16["fp16"]["min_loss_scale"] >= 1
    fp32 = build_ds_config(TrainConfig(precision="fp32"), OptimConfig(), 1)
    assert "bf16" not in fp32 and "fp16" not in fp32


def test_clipping_follows_config() -> None:
    assert build_ds_config(TrainConfig(), OptimConfig(), 1)["gradient_clipping"] == 0.0
    assert build_ds_config(TrainConfig(), OptimConfig(clip_grad=1.0), 1)["gradient_clipping"] == 1.0


def test_no_forced_syncs_where_nothing_needs_them() -> None:
    """The throughput timer is off; bf16's overflow check is off where the step guards the
    update itself (fused Adam) and on with the unfused one; no grad norm when not asked for."""
    cfg = build_ds_config(TrainConfig(precision="bf16"), OptimConfig(), 1)
    assert cfg["timers"]["throughput"] == {"enabled": False, "synchronized": False}
    assert cfg["bf16"]["check_grad_overflow"] is False
    unfused = build_ds_config(TrainConfig(precision="bf16"), OptimConfig(fused=False), 1)
    assert unfused["bf16"]["check_grad_overflow"] is True
    assert "compute_grad_norm" not in cfg["zero_optimization"]  # DeepSpeed's default: on
    off = build_ds_config(TrainConfig(), OptimConfig(grad_norm=False), 1)
    assert off["zero_optimization"]["compute_grad_norm"] is False


def test_clipping_needs_the_norm() -> None:
    assert OptimConfig(clip_grad=1.0, grad_norm=False).problems() == [
        ("grad_norm", "must be true when clip_grad > 0 (clipping needs the norm)")
    ]
