"""One job's configuration: the per-package schemas composed into `JobConfig`.

A preset YAML file and `key=value` overrides are merged onto the structured schema with
OmegaConf, then every value is checked. Any problem becomes one `ConfigError` naming the key, so
the CLI can print one line and exit 2 before any process group exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data_pipeline.config import PACKED_MISSING, DataConfig, has_packed
from model.config import ModelConfig
from trainer.config import LoggingConfig, OptimConfig, ProfileConfig, TrainConfig
from trainer.secrets import is_secret_name, secret_env_values


class ConfigError(ValueError):
    """A bad configuration value or argument; `str()` is the one line shown to the user."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


@dataclass
class RunConfig:
    """Name and directory of a run."""

    name: str = "run"  # the run's name (wandb, the default run dir)
    dir: str | None = None  # default: runs/<name>


@dataclass
class JobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def run_dir(self) -> Path:
        return Path(self.run.dir) if self.run.dir else Path("runs") / self.run.name


def _omegaconf_error(exc: OmegaConfBaseException) -> ConfigError:
    key = getattr(exc, "full_key", None) or ""
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if type(exc).__name__ == "ConfigKeyError" and key:
        msg = "unknown key"
    return ConfigError(key, msg)


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> JobConfig:
    """Schema defaults <- the YAML file (over its `base` presets) <- dotlist overrides,
    type-checked and validated."""
    schema = OmegaConf.structured(JobConfig)
    try:
        layers = [schema]
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ConfigError("--config", f"no such file: {p}")
            layers += preset_layers(p)
        for item in overrides or []:
            if "=" not in item:
                raise ConfigError(item, "overrides take the form key=value")
        if overrides:
            layers.append(OmegaConf.from_dotlist(overrides))
        merged = OmegaConf.merge(*layers)
        secret_text = secret_interpolations(OmegaConf.to_container(merged, resolve=False))
        job = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise _omegaconf_error(exc) from None
    assert isinstance(job, JobConfig)
    validate(job)
    check_secrets(job, secret_text)
    job._secret_text = secret_text  # type: ignore[attr-defined]
    return job


def preset_layers(path: Path, seen: tuple[Path, ...] = ()) -> list[Any]:
    """A preset and the presets it builds on: a top-level `base: FILE` (relative to the
    preset's folder) is loaded first, and the preset's own values override it."""
    path = path.resolve()
    if path in seen:
        raise ConfigError("base", f"{path} is its own base (through {seen[-1]})")
    if not path.is_file():
        raise ConfigError("base" if seen else "--config", f"no such file: {path}")
    try:
        layer = OmegaConf.load(path)
    except Exception as exc:  # yaml syntax errors come in several types
        raise ConfigError("--config", f"cannot parse {path}: {str(exc).splitlines()[0]}") from None
    base = layer.pop("base", None) if isinstance(layer, DictConfig) else None
    if base is None:
        return [layer]
    return [*preset_layers(path.parent / str(base), (*seen, path)), layer]


# Config keys whose values become names and paths (of the run dir, its files, the Slurm job,
# the wandb project): a secret there would be in plain sight, so it is refused outright.
NAMING_KEYS = ("run.name", "run.dir", "data.dir", "logging.wandb_project")
_ENV_REFERENCE = re.compile(r"\$\{(?:oc\.env|env)\s*:\s*([A-Za-z_][A-Za-z0-9_]*)")


def leaf_items(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested dict."""
    if not isinstance(node, dict):
        return [(prefix, node)]
    out = []
    for key, value in node.items():
        out += leaf_items(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def secret_interpolations(raw: Any) -> dict[str, str]:
    """Keys whose unresolved value refers to an environment variable with a secret-looking
    name (`${oc.env:WANDB_API_KEY}`), with that text: dumps keep the text, not the value."""
    return {
        key: value
        for key, value in leaf_items(raw)
        if isinstance(value, str) and any(is_secret_name(n) for n in _ENV_REFERENCE.findall(value))
    }


def check_secrets(job: JobConfig, secret_text: dict[str, str]) -> None:
    """A secret may not name things (NAMING_KEYS), and no value may hold a secret variable's
    value by other means than an interpolation (a shell's `$WANDB_API_KEY`): the dumps could
    not keep it out."""
    secrets = secret_env_values()
    for key, value in leaf_items(OmegaConf.to_container(OmegaConf.structured(job))):
        if key in secret_text and key in NAMING_KEYS:
            raise ConfigError(
                key,
                f"comes from {secret_text[key]}, which looks like a secret; it would name the "
                "run's files and jobs",
            )
        leaked = isinstance(value, str) and any(s in value for s in secrets)
        if leaked and key not in secret_text:
            raise ConfigError(
                key,
                "holds the value of an environment variable that looks like a secret; "
                "write it as ${oc.env:NAME}, which the config files keep as text",
            )


def validate(job: JobConfig) -> None:
    """Raise ConfigError for the first invalid value, named by its full key."""
    sections = {
        "model": job.model,
        "data": job.data,
        "optim": job.optim,
        "train": job.train,
        "logging": job.logging,
        "profile": job.profile,
    }
    for name, section in sections.items():
        problems = section.problems()
        if problems:
            key, message = problems[0]
            raise ConfigError(f"{name}.{key}", message)
    if not job.run.name or "/" in job.run.name:
        raise ConfigError("run.name", f"must be a non-empty name without '/', got {job.run.name!r}")
    if job.optim.schedule == "linear" and job.train.max_steps < job.optim.warmup_steps:
        raise ConfigError(
            "optim.warmup_steps",
            f"the linear schedule decays from the end of the warm-up to train.max_steps="
            f"{job.train.max_steps}; a warm-up of {job.optim.warmup_steps} steps is longer",
        )


def check_data_dir(job: JobConfig) -> dict[str, Any]:
    """The data dir must hold a manifest written by `paperscale prepare`; returns it."""
    from data_pipeline.manifest import MANIFEST_NAME, read_manifest

    data_dir = Path(job.data.dir)
    if not (data_dir / MANIFEST_NAME).is_file():
        raise ConfigError(
            "data.dir",
            f"{job.data.dir} has no {MANIFEST_NAME} (run `paperscale prepare` first)",
        )
    try:
        manifest = read_manifest(data_dir)
    except (OSError, ValueError) as exc:
        raise ConfigError("data.dir", f"not a valid manifest: {exc}") from None
    shards = manifest["splits"].get("train", {}).get("shards", [])
    if job.data.store == "packed" and not has_packed(shards):
        raise ConfigError("data.store", f"{PACKED_MISSING} (the train split of {job.data.dir})")
    return manifest


def to_dict(job: JobConfig) -> dict[str, Any]:
    """The job as a nested dict, as every file written from it holds it: values that came
    from a secret-looking environment variable keep their interpolation text."""
    out = OmegaConf.to_container(OmegaConf.structured(job))
    assert isinstance(out, dict)
    for key, text in getattr(job, "_secret_text", {}).items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = text
    return out  # type: ignore[return-value]


def to_yaml(job: JobConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(to_dict(job)))
