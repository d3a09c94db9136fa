"""Presets that build on others (`base: FILE`), and the shipped presets themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_a_preset_overrides_its_base_and_overrides_override_both(tmp_path: Path) -> None:
    (tmp_path / "parent.yaml").write_text(
        "model:\n  d_model: 64\n  n_heads: 2\noptim:\n  lr: 0.5\n"
    )
    (tmp_path / "child.yaml").write_text("base: parent.yaml\noptim:\n  lr: 0.25\n")
    job = load_config(tmp_path / "child.yaml", ["model.n_heads=4"])
    assert (job.model.d_model, job.model.n_heads, job.optim.lr) == (64, 4, 0.25)


def test_a_missing_or_circular_base_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"base.*no such file"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("base: c.yaml\n")
    (tmp_path / "c.yaml").write_text("base: b.yaml\n")
    with pytest.raises(ConfigError, match="its own base"):
        load_config(tmp_path / "b.yaml")


def test_the_demo_preset_is_the_tiny_models_layers_at_half_width_on_a_budget() -> None:
    tiny, demo = load_config(ROOT / "configs/tiny.yaml"), load_config(ROOT / "configs/demo.yaml")
    shape = ("n_heads", "encoder_layers", "decoder_layers", "pre_norm")
    assert all(getattr(demo.model, k) == getattr(tiny.model, k) for k in shape)
    assert (demo.model.d_model, demo.model.d_ff) == (tiny.model.d_model // 2, tiny.model.d_ff // 2)
    assert demo.train.budget_minutes > 0 and demo.optim.schedule == "linear"
