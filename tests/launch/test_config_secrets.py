"""Secrets through the config: a value interpolated from a secret-looking environment variable
stays interpolation text in every dump; a secret that would name the run, its files or its job
is refused; a secret's value written out by the shell is refused too. Environment variables
of ordinary names resolve as usual."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launch.config import ConfigError, load_config, to_dict, to_yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs/tiny.yaml"


def test_secret_interpolation_is_kept_as_text_in_dumps(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SEED_SECRET", "1234567")
    job = load_config(CONFIG, ["train.seed=${oc.env:SEED_SECRET}"])
    assert job.train.seed == 1234567  # the run uses the value
    assert to_dict(job)["train"]["seed"] == "${oc.env:SEED_SECRET}"
    assert "seed: ${oc.env:SEED_SECRET}" in to_yaml(job) and "1234567" not in to_yaml(job)
    # the dump (RUN/config.yaml) loads back to the same job in the same environment
    dumped = tmp_path / "config.yaml"
    dumped.write_text(to_yaml(job))
    again = load_config(dumped)
    assert again.train.seed == 1234567 and to_yaml(again) == to_yaml(job)


def test_ordinary_environment_variables_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATA_ROOT", "/data/wmt")
    job = load_config(CONFIG, ["data.dir=${oc.env:DATA_ROOT}/ende"])
    assert job.data.dir == "/data/wmt/ende" and to_dict(job)["data"]["dir"] == "/data/wmt/ende"


@pytest.mark.parametrize("key", ["run.name", "run.dir", "data.dir", "logging.wandb_project"])
def test_a_secret_may_not_name_anything(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "wandb-canary-0123")
    with pytest.raises(ConfigError, match="looks like a secret") as err:
        load_config(CONFIG, [f"{key}=${{oc.env:WANDB_API_KEY}}"])
    assert err.value.key == key and "wandb-canary-0123" not in str(err.value)


def test_a_secret_value_typed_by_the_shell_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf-canary-9876")
    with pytest.raises(ConfigError, match="holds the value of an environment variable") as err:
        load_config(CONFIG, ["run.name=hf-canary-9876"])
    assert "hf-canary-9876" not in str(err.value)


def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "WANDB_API_KEY": "wandb-canary-55"}
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "submit", "--config", str(CONFIG), "--cluster",
         "local", "--dry-run", "run.name=${oc.env:WANDB_API_KEY}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "run.name" in proc.stderr and "wandb-canary-55" not in proc.stderr + proc.stdout
