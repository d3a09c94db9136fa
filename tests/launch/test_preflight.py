"""The resume preflight on hand-made run dirs: what it accepts, and the one line for each
problem (no processes, no DeepSpeed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from launch.config import ConfigError, load_config
from launch.preflight import check_resume
from trainer.run_dir import RunDir, tag_for

MODEL = {"d_model": 32, "n_heads": 2, "d_ff": 64, "encoder_layers": 1, "decoder_layers": 1}


def checkpoint(run: Path, precision: str = "bf16", step: int = 4, **model: object) -> Path:
    ckpts = RunDir(run).checkpoints
    tag = tag_for(step)
    ckpts.tag_dir(tag).mkdir(parents=True)
    torch.save({"data": {"x": torch.zeros(2)}}, ckpts.rank_file(tag, 0))
    meta = {"model": {**MODEL, **model}, "config": {"train": {"precision": precision}}}
    ckpts.meta_file(tag).write_text(json.dumps(meta))
    ckpts.complete_marker(tag).write_text(f"{step}\n")
    ckpts.latest_file.write_text(tag + "\n")
    return ckpts.tag_dir(tag)


def job(*overrides: str) -> object:
    return load_config(None, [f"model.{k}={v}" for k, v in MODEL.items()] + list(overrides))


def test_no_checkpoint_and_a_matching_one_pass(tmp_path: Path) -> None:
    check_resume(job(), tmp_path)  # type: ignore[arg-type]
    checkpoint(tmp_path, precision="bf16")
    check_resume(job("train.precision=bf16"), tmp_path)  # type: ignore[arg-type]
    check_resume(job("train.precision=auto"), tmp_path)  # auto follows the checkpoint


@pytest.mark.parametrize(
    ("saved", "override", "needle"),
    [
        ({"d_model": 64}, "train.precision=bf16", "model.d_model"),
        ({}, "train.precision=fp32", "train.precision: the run dir's checkpoint step_00000004"),
    ],
)
def test_another_model_or_precision_is_refused(
    tmp_path: Path, saved: dict[str, object], override: str, needle: str
) -> None:
    checkpoint(tmp_path, "bf16", **saved)
    with pytest.raises(ConfigError) as err:
        check_resume(job(override), tmp_path)  # type: ignore[arg-type]
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_an_fp16_checkpoint_needs_a_gpu_under_auto(tmp_path: Path) -> None:
    checkpoint(tmp_path, precision="fp16")
    with pytest.raises(ConfigError, match="saved in fp16, which needs a GPU"):
        check_resume(job("train.precision=auto", "train.device=cpu"), tmp_path)  # type: ignore[arg-type]


def test_latest_must_name_a_complete_checkpoint(tmp_path: Path) -> None:
    tag_dir = checkpoint(tmp_path)
    (tag_dir / "complete").unlink()
    with pytest.raises(ConfigError, match="has no 'complete' marker"):
        check_resume(job(), tmp_path)  # type: ignore[arg-type]
    RunDir(tmp_path).checkpoints.latest_file.write_text("elsewhere\n")
    with pytest.raises(ConfigError, match="which is not a checkpoint dir"):
        check_resume(job(), tmp_path)  # type: ignore[arg-type]


def test_files_that_would_run_code_are_refused(tmp_path: Path) -> None:
    tag_dir = checkpoint(tmp_path)

    class Payload:
        def __reduce__(self) -> tuple:
            return (print, ("ran",))

    torch.save({"x": Payload()}, tag_dir / "rank_00001.pt")
    with pytest.raises(ConfigError) as err:
        check_resume(job("train.precision=bf16"), tmp_path)  # type: ignore[arg-type]
    assert "rank_00001.pt" in str(err.value)


def test_meta_that_is_not_json_is_named(tmp_path: Path) -> None:
    tag_dir = checkpoint(tmp_path)
    (tag_dir / "meta.json").write_text("{")
    with pytest.raises(ConfigError, match="is missing or not JSON"):
        check_resume(job(), tmp_path)  # type: ignore[arg-type]
