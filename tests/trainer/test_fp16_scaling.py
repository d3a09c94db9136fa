"""fp16 dynamic loss scaling as DeepSpeed runs it with the settings we generate.

DeepSpeed's CPU accelerator refuses fp16 engines ("Type fp16 is not supported on your device"),
so the engine-level path runs only on GPUs; the scaler that decides overflow skips and the
scale schedule is plain Python and runs here, built from our generated config.
"""

from __future__ import annotations

import pytest
import torch

from trainer.config import OptimConfig, TrainConfig
from trainer.dist import DistEnv
from trainer.ds.config import build_ds_config


@pytest.fixture
def process_group(rank_env: DistEnv) -> None:
    """The session's world of one (tests/trainer/conftest.py)."""


def scaler_from_our_config(min_loss_scale: int = 1):  # type: ignore[no-untyped-def]
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler

    cfg = build_ds_config(TrainConfig(precision="fp16"), OptimConfig(), world_size=1)
    cfg["fp16"]["min_loss_scale"] = min_loss_scale
    fp16 = DeepSpeedConfig(cfg).float16_config  # DeepSpeed's own parsing of our dict
    assert fp16.enabled and fp16.loss_scale == 0  # 0 = dynamic
    return CreateLossScaler(
        dtype=torch.half,
        static_loss_scale=fp16.loss_scale,
        dynamic_scaling=True,
        dynamic_loss_args=fp16.dynamic_loss_scale_args(),
    )


def test_overflow_halves_after_hysteresis_and_window_doubles(process_group: None) -> None:
    scaler = scaler_from_our_config()
    assert scaler.cur_scale == 2.0**16
    scaler.update_scale(overflow=True)  # hysteresis 2: the first overflow only uses it up
    assert scaler.cur_scale == 2.0**16
    scaler.update_scale(overflow=True)
    assert scaler.cur_scale == 2.0**15
    for _ in range(1000):  # a full loss_scale_window of good steps after the overflow ...
        scaler.update_scale(overflow=False)
    assert scaler.cur_scale == 2.0**15
    scaler.update_scale(overflow=False)  # ... then the scale doubles again
    assert scaler.cur_scale == 2.0**16


def test_scale_never_goes_below_min_loss_scale(process_group: None) -> None:
    scaler = scaler_from_our_config(min_loss_scale=1024)
    for _ in range(200):
        try:
            scaler.update_scale(overflow=True)
        except Exception as exc:  # DeepSpeed stops the run once it cannot go lower
            assert "minimum" in str(exc)
            break
    assert scaler.cur_scale == 1024.0
