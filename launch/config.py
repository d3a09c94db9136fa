"""One job's configuration: the per-package schemas composed into `JobConfig`.

A preset YAML file and `key=value` overrides are merged onto the structured schema with
OmegaConf, then every value is checked. Any problem becomes one `ConfigError` naming the key, so
the CLI can print one line and exit 2 before any process group exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data_pipeline.config import DataConfig
from model.config import ModelConfig
from trainer.config import LoggingConfig, OptimConfig, ProfileConfig, TrainConfig


class ConfigError(ValueError):
    """A bad configuration value or argument; `str()` is the one line shown to the user."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


@dataclass
class RunConfig:
    """Name and directory of a run."""

    name: str = "run"
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
    """Schema defaults <- YAML file <- dotlist overrides, type-checked and validated."""
    schema = OmegaConf.structured(JobConfig)
    try:
        layers = [schema]
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ConfigError("--config", f"no such file: {p}")
            try:
                layers.append(OmegaConf.load(p))
            except Exception as exc:  # yaml syntax errors come in several types
                raise ConfigError(
                    "--config", f"cannot parse {p}: {str(exc).splitlines()[0]}"
                ) from None
        for item in overrides or []:
            if "=" not in item:
                raise ConfigError(item, "overrides take the form key=value")
        if overrides:
            layers.append(OmegaConf.from_dotlist(overrides))
        merged = OmegaConf.merge(*layers)
        job = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise _omegaconf_error(exc) from None
    assert isinstance(job, JobConfig)
    validate(job)
    return job


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
        return read_manifest(data_dir)
    except (OSError, ValueError) as exc:
        raise ConfigError("data.dir", f"not a valid manifest: {exc}") from None


def to_yaml(job: JobConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(job))


def to_dict(job: JobConfig) -> dict[str, Any]:
    out = OmegaConf.to_container(OmegaConf.structured(job))
    assert isinstance(out, dict)
    return out  # type: ignore[return-value]
