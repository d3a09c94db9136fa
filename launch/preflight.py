"""Checks of a run dir's checkpoint before a resumed run starts any process.

A resumed run must train the same model in the same precision, from files that are
checkpoints and that load without running code. Each problem is one ConfigError naming the key
or the file, raised before anything is written into the run dir.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from launch.config import ConfigError, JobConfig
from model.config import ModelConfig
from trainer.run_dir import CheckpointDir, LayoutError, RunDir

# Settings a checkpoint cannot be resumed under another value of (DeepSpeed's files differ).
FIXED_TRAIN_KEYS = ("precision",)


def resume_tag(ckpts: CheckpointDir) -> str | None:
    """The tag `latest` names; an error when it names nothing usable."""
    try:
        return ckpts.inspect_latest()
    except LayoutError as exc:
        raise ConfigError("checkpoint", str(exc)) from None


def saved_meta(ckpts: CheckpointDir, tag: str) -> dict[str, Any]:
    try:
        return ckpts.read_meta(tag)
    except LayoutError as exc:
        raise ConfigError("checkpoint", str(exc)) from None


def check_same_run(job: JobConfig, meta: dict[str, Any], tag: str) -> None:
    """The config must describe the checkpoint's model and precision."""
    saved_model = meta["model"]
    for f in fields(ModelConfig):
        want = getattr(job.model, f.name)
        if want is None or f.name not in saved_model:
            continue  # e.g. vocab_size null: taken from the tokenizer
        if saved_model[f.name] != want:
            raise ConfigError(
                f"model.{f.name}",
                f"the run dir's checkpoint {tag} has {saved_model[f.name]!r}, the config "
                f"{want!r}: a resumed run trains the same model (use a new --run-dir)",
            )
    saved_train = (meta.get("config") or {}).get("train") or {}
    saved_precision = saved_train.get("precision")
    if job.train.precision == "auto" and saved_precision is not None:
        from launch.local import use_cuda
        from trainer.precision import runs_on

        device = "cuda" if use_cuda(job.train.device) else "cpu"
        if not runs_on(saved_precision, device):
            raise ConfigError(
                "train.precision",
                f"the run dir's checkpoint {tag} was saved in {saved_precision}, which needs "
                "a GPU; this machine has none (resume it where there is one)",
            )
    for key in FIXED_TRAIN_KEYS:
        want = getattr(job.train, key)
        if key == "precision" and want == "auto":
            continue  # auto follows the checkpoint's precision (trainer/precision.py)
        if key in saved_train and saved_train[key] != want:
            raise ConfigError(
                f"train.{key}",
                f"the run dir's checkpoint {tag} was saved with {saved_train[key]!r}; resuming "
                f"with {want!r} is not supported (use a new --run-dir)",
            )


def check_files_load(tag_dir: Path) -> None:
    """Every .pt file must read as a weights-only torch file (nothing unpickled runs code)."""
    from trainer.checkpoint.safe_load import check_loadable

    files = sorted(tag_dir.glob("*.pt"))
    if not files:
        raise ConfigError("checkpoint", f"{tag_dir} holds no checkpoint files")
    for path in files:
        problem = check_loadable(path)
        if problem:
            raise ConfigError("checkpoint", problem)


def check_resume(job: JobConfig, run_dir: Path) -> None:
    """Raise ConfigError when `run_dir` holds a checkpoint this job cannot resume from."""
    ckpts = RunDir(run_dir).checkpoints
    tag = resume_tag(ckpts)
    if tag is None:
        return
    check_same_run(job, saved_meta(ckpts, tag), tag)
    check_files_load(ckpts.tag_dir(tag))
