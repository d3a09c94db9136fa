"""docs/configuration.md is generated from the config dataclasses and held equal to them;
`paperscale config` prints the resolved config a run would use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from launch.config_reference import REFERENCE, field_notes, reference_markdown, undocumented
from tests.integration.conftest import cli_env
from trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_in_docs_is_the_one_the_code_generates() -> None:
    assert REFERENCE.read_text() == reference_markdown(), (
        "docs/configuration.md is out of date: "
        "paperscale config --reference > docs/configuration.md"
    )


def test_every_key_says_what_it_does() -> None:
    assert undocumented() == []
    notes = field_notes(TrainConfig)
    assert notes["budget_minutes"].startswith("wall-clock minutes for the whole run")  # above
    assert notes["eval_every"] == "validation loss; 0 = only at the end"  # beside


def test_the_reference_names_defaults_and_the_presets_that_change_them() -> None:
    text = reference_markdown()
    row = next(x for x in text.splitlines() if x.startswith("| `model.d_model` |"))
    assert "| int | `512` |" in row and "big: 1024" in row and "tiny: 256" in row
    row = next(x for x in text.splitlines() if x.startswith("| `optim.lr` |"))
    assert "| `null` |" in row and "float \\| None" in row


def paperscale(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_config_prints_the_resolved_config_and_refuses_bad_input_in_one_line() -> None:
    proc = paperscale("config", "--config", "configs/tiny.yaml", "train.max_steps=7")
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert resolved["train"]["max_steps"] == 7 and resolved["model"]["d_model"] == 256
    bad = paperscale("config", "--reference", "--config", "configs/tiny.yaml")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--reference" in bad.stderr
    bad = paperscale("config", "model.d_model=abc")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "model.d_model" in bad.stderr
