"""Consolidated fp32 weights from a DeepSpeed checkpoint of any ZeRO stage, and loading them back.

An export directory holds `model.safetensors` (fp32), `model.json` (the ModelConfig),
`config.yaml` (the run's resolved config) and `spm.model`: everything `translate` needs, and
nothing that is unpickled when read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from model.config import ModelConfig
from model.transformer import Transformer
from trainer.checkpoint import META, write_atomic

WEIGHTS = "model.safetensors"
MODEL_JSON = "model.json"


def consolidated_state_dict(tag_dir: Path) -> dict[str, torch.Tensor]:
    """fp32 master weights merged from every rank's optimizer partition."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
    return {k: v.detach().float().contiguous() for k, v in state.items()}


def write_export(
    out_dir: Path,
    state: dict[str, torch.Tensor],
    model_cfg: dict[str, Any],
    config: dict[str, Any],
    spm_model: Path,
) -> None:
    """Write an export directory; the weights file is renamed into place last."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spm_model, out_dir / "spm.model")
    write_atomic(out_dir / MODEL_JSON, json.dumps(model_cfg, indent=1))
    from omegaconf import OmegaConf

    write_atomic(out_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(config)))
    tmp = out_dir / f".{WEIGHTS}.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(out_dir / WEIGHTS)


def export_checkpoint(tag_dir: Path, out_dir: Path, spm_model: Path) -> Path:
    """Export one checkpoint directory (as written by trainer.checkpoint.save)."""
    meta = json.loads((tag_dir / META).read_text())
    write_export(
        out_dir, consolidated_state_dict(tag_dir), meta["model"], meta["config"], spm_model
    )
    return out_dir


def load_exported(export_dir: Path, device: torch.device | str = "cpu") -> Transformer:
    """Build the model from an export directory (safetensors only; nothing is unpickled)."""
    cfg = ModelConfig(**json.loads((export_dir / MODEL_JSON).read_text()))
    model = Transformer(cfg)
    state = load_file(str(export_dir / WEIGHTS), device=str(device))
    model.load_state_dict(state, strict=True)
    return model.to(device).eval()
