"""Consolidated fp32 weights from a DeepSpeed checkpoint of any ZeRO stage, and loading them back.

An export directory holds `model.safetensors` (fp32), `model.json` (the ModelConfig),
`config.yaml` (the run's resolved config) and `spm.model`: everything `translate` needs, and
nothing that is unpickled when read.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
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

    # DeepSpeed reports its progress on stdout; keep stdout for the caller's own output.
    with contextlib.redirect_stdout(sys.stderr):
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


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean in float64 (then fp32), so K identical inputs return that input exactly."""
    if not states:
        raise ValueError("nothing to average")
    keys = states[0].keys()
    for state in states[1:]:
        if state.keys() != keys:
            raise ValueError("checkpoints to average have different parameter names")
    out = {}
    for key in keys:
        total = torch.zeros_like(states[0][key], dtype=torch.float64)
        for state in states:
            total += state[key].double()
        out[key] = (total / len(states)).float()
    return out


def export_run(run_dir: Path, out_dir: Path, *, tag: str | None = None, last: int = 1) -> list[str]:
    """Export checkpoint `tag` (default: latest) or the average of the last `last` complete ones.

    Returns the tags used. The sentencepiece model is the run's copy (RUN/spm.model).
    """
    from trainer.checkpoint import complete_tags, latest_tag

    ckpt_dir = run_dir / "checkpoints"
    if tag is not None:
        if not (ckpt_dir / tag / "complete").is_file():
            raise ValueError(f"{ckpt_dir / tag} is not a complete checkpoint")
        tags = [tag]
    else:
        tags = complete_tags(ckpt_dir)
        newest = latest_tag(ckpt_dir)
        if newest is not None:  # never past `latest`: a newer dir could be an unfinished save
            tags = [t for t in tags if t <= newest]
        if not tags:
            raise ValueError(f"{ckpt_dir} holds no complete checkpoint")
        if last > len(tags):
            raise ValueError(f"--last {last} but {ckpt_dir} holds only {len(tags)} checkpoints")
        tags = tags[-last:]
    states = [consolidated_state_dict(ckpt_dir / t) for t in tags]
    meta = json.loads((ckpt_dir / tags[-1] / META).read_text())
    state = states[0] if len(states) == 1 else average_state_dicts(states)
    write_export(out_dir, state, meta["model"], meta["config"], run_dir / "spm.model")
    return tags
