"""Consolidated fp32 weights from a DeepSpeed checkpoint of any ZeRO stage, written as an export.

An export directory holds `model.safetensors` (fp32), `model.json` (the ModelConfig),
`config.yaml` (the run's resolved config) and `spm.model`: everything `translate` needs, and
nothing that is unpickled when read (serve/engine_paperscale.py loads it).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from trainer.run_dir import CONFIG, TOKENIZER, CheckpointDir, LayoutError, RunDir, write_atomic

WEIGHTS = "model.safetensors"
MODEL_JSON = "model.json"


def is_export_dir(path: Path) -> bool:
    """Whether `path` holds an export's weights and model description."""
    return (path / WEIGHTS).is_file() and (path / MODEL_JSON).is_file()


def consolidated_state_dict(tag_dir: Path) -> dict[str, torch.Tensor]:
    """fp32 master weights merged from every rank's optimizer partition."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from trainer.checkpoint.safe_load import forbid_code_in_checkpoints

    forbid_code_in_checkpoints()
    if not any(tag_dir.glob("*optim_states.pt")):  # ZeRO stage 0: no optimizer partitions
        model_states = torch.load(
            tag_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=True
        )
        return stage0_state_dict(model_states)
    if any(tag_dir.glob(f"{BF16_PREFIX}*optim_states.pt")):
        return bf16_optimizer_state_dict(tag_dir)
    # DeepSpeed reports its progress on stdout; keep stdout for the caller's own output.
    with contextlib.redirect_stdout(sys.stderr):
        state = get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
    return {k: v.detach().float().contiguous() for k, v in state.items()}


BF16_PREFIX = "bf16_zero_pp_rank_"  # the partitions DeepSpeed's BF16_Optimizer writes


def bf16_optimizer_state_dict(tag_dir: Path) -> dict[str, torch.Tensor]:
    """fp32 weights of a checkpoint of DeepSpeed's BF16_Optimizer (ZeRO 1 summing gradients in
    fp32: train.grad_accum_dtype), which zero_to_fp32 does not read. Each rank's file holds its
    contiguous slice of the flat fp32 parameters and where each parameter's piece sits in it;
    a parameter is its pieces in rank order."""
    files = sorted(
        tag_dir.glob(f"{BF16_PREFIX}*_mp_rank_00_optim_states.pt"),
        key=lambda f: int(f.name[len(BF16_PREFIX) :].split("_")[0]),
    )
    model_states = torch.load(
        tag_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=True
    )
    shapes = {k: v for group in model_states["param_shapes"] for k, v in group.items()}
    pieces: dict[str, list[torch.Tensor]] = {name: [] for name in shapes}
    for f in files:
        saved = torch.load(f, map_location="cpu", weights_only=True)["optimizer_state_dict"]
        for flat, where in zip(
            saved["single_partition_of_fp32_groups"], saved["param_slice_mappings"], strict=True
        ):
            for name, piece in where.items():
                pieces[name].append(flat.narrow(0, piece.start, piece.numel))
    state = {k: v.detach().float().contiguous() for k, v in model_states["module"].items()}
    for name, shape in shapes.items():
        whole = torch.cat(pieces[name]) if pieces[name] else torch.empty(0)
        if whole.numel() != shape.numel():
            raise ValueError(f"{name}: {whole.numel()} fp32 elements saved for shape {shape}")
        state[name] = whole.reshape(shape).contiguous()
    for alias, name in model_states.get("shared_params", {}).items():
        state[alias] = state[name]
    return state


def stage0_state_dict(model_states: dict[str, Any]) -> dict[str, torch.Tensor]:
    """fp32 weights of a ZeRO stage 0 checkpoint (DeepSpeed's zero_to_fp32 reads ZeRO 1-3 only).

    With bf16/fp16 the module holds 16-bit copies and the optimizer wrapper the fp32 masters
    (`fp32_groups`, in the order of the module's parameters); with fp32 the module's own
    tensors are the masters.
    """
    module: dict[str, torch.Tensor] = model_states["module"]
    buffers = set(model_states.get("buffer_names") or [])
    names = [k for k in module if k not in buffers]
    optimizer = model_states.get("optimizer")
    masters = optimizer.get("fp32_groups") if isinstance(optimizer, dict) else None
    state = {k: v.detach().float().contiguous() for k, v in module.items()}
    if masters:
        flat = [t for group in masters for t in group]
        if len(flat) != len(names):
            raise ValueError(f"{len(flat)} fp32 master tensors for {len(names)} parameters")
        for name, master in zip(names, flat, strict=True):
            if master.numel() != module[name].numel():
                raise ValueError(f"fp32 master of {name} has {master.numel()} elements")
            state[name] = master.detach().float().reshape(module[name].shape).contiguous()
    return state


def readable_state_dict(tag_dir: Path) -> dict[str, torch.Tensor]:
    """`consolidated_state_dict`, with a damaged or code-carrying file as one ValueError line
    (DeepSpeed's progress lines are shown on success only)."""
    progress = io.StringIO()
    try:
        with contextlib.redirect_stderr(progress):
            state = consolidated_state_dict(tag_dir)
        sys.stderr.write(progress.getvalue())
        return state
    except Exception as exc:  # unpickling and DeepSpeed's own checks raise many types
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        if "weights only load failed" in first.lower():
            first = "it holds objects that loading would have to run code for; refused"
        raise ValueError(f"checkpoint {tag_dir} cannot be read: {first[:200]}") from None


def write_export(
    out_dir: Path,
    state: dict[str, torch.Tensor],
    model_cfg: dict[str, Any],
    config: dict[str, Any],
    spm_model: Path,
) -> None:
    """Write an export directory; the weights file is renamed into place last."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spm_model, out_dir / TOKENIZER)
    write_atomic(out_dir / MODEL_JSON, json.dumps(model_cfg, indent=1))
    from omegaconf import OmegaConf

    write_atomic(out_dir / CONFIG, OmegaConf.to_yaml(OmegaConf.create(config)))
    tmp = out_dir / f".{WEIGHTS}.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(out_dir / WEIGHTS)


def export_checkpoint(tag_dir: Path, out_dir: Path, spm_model: Path) -> Path:
    """Export one checkpoint directory (as written by trainer.checkpoint.manager)."""
    meta = CheckpointDir(tag_dir.parent).read_meta(tag_dir.name)
    write_export(
        out_dir, consolidated_state_dict(tag_dir), meta["model"], meta["config"], spm_model
    )
    return out_dir


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
    run = RunDir(run_dir)
    ckpts = run.checkpoints
    if tag is not None:
        if not ckpts.is_complete(tag):
            raise ValueError(f"{ckpts.tag_dir(tag)} is not a complete checkpoint")
        tags = [tag]
    else:
        tags = ckpts.exportable_tags()
        if not tags:
            raise ValueError(f"{ckpts.root} holds no complete checkpoint")
        if last > len(tags):
            raise ValueError(f"--last {last} but {ckpts.root} holds only {len(tags)} checkpoints")
        tags = tags[-last:]
    states = [readable_state_dict(ckpts.tag_dir(t)) for t in tags]
    try:
        meta = ckpts.read_meta(tags[-1])
    except LayoutError as exc:
        raise ValueError(str(exc)) from None
    state = states[0] if len(states) == 1 else average_state_dicts(states)
    write_export(out_dir, state, meta["model"], meta["config"], run.tokenizer)
    return tags
