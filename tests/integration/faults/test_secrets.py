"""Secrets in the environment (WANDB_API_KEY and variables named like *TOKEN*, *KEY*, *SECRET*,
*PASSWORD*) appear in no file of a run dir: config, metrics, console output, checkpoints,
the export, TensorBoard events and the offline wandb run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.faults.conftest import CANARY, SECRET_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_no_secret_in_any_file_of_the_run_dir(reference_run: Path) -> None:
    files = [p for p in reference_run.rglob("*") if p.is_file()]
    kinds = {p.relative_to(reference_run).parts[0] for p in files}
    # the run really wrote every kind of output that could leak
    assert {"config.yaml", "metrics.jsonl", "checkpoints", "tb", "wandb", "model"} <= kinds
    assert any(p.suffix == ".wandb" for p in files)
    assert any("tfevents" in p.name for p in files)
    assert "launcher.log" in kinds  # the console output of every rank
    leaks = [
        str(p)
        for p in files
        for value in (CANARY, *SECRET_ENV.values())
        if len(value) > 1 and value.encode() in p.read_bytes()
    ]
    assert not leaks
    # train.seed came from ${oc.env:SEED_SECRET}: every config the run wrote keeps that text
    text = "${oc.env:SEED_SECRET}"
    assert text in (reference_run / "config.yaml").read_text()
    assert text in (reference_run / "model" / "config.yaml").read_text()
    metas = list(reference_run.glob("checkpoints/step_*/meta.json"))
    assert metas and all(text in m.read_text() for m in metas)
