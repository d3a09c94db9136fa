"""`train.precision: auto` in real runs: the resolved precision in the log, config.yaml,
decisions.json, summary.json and `status`; a later start where auto resolves differently keeps
the run's first decision and says so (both ways, with PAPERSCALE_CPU_BF16), after a checkpoint
and before any; MFU stays in (0, 1] at the demo preset's model size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.integration.conftest import TINY_MODEL, decided, paperscale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FORCED = {"1": "PAPERSCALE_CPU_BF16=1 forces native bf16", "0": "PAPERSCALE_CPU_BF16=0 forces"}
PICKS = {"1": "bf16", "0": "fp32"}


def train(
    run_dir: Path, data: Path, steps: int, switch: str, cwd: Path, *extra: str, ok: bool = True
) -> str:
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "1",
        "--run-dir", str(run_dir), f"data.dir={data}", *TINY_MODEL, "train.precision=auto",
        "train.grad_accum=1", "train.log_every=1", "train.eval_every=0", "train.save_every=2",
        "train.bleu_samples=4", "train.bleu_beam=1", "logging.wandb=disabled",
        "logging.tensorboard=false", f"train.max_steps={steps}", *extra,
        cwd=cwd, env={"PAPERSCALE_CPU_BF16": switch, **(FAULT_KILL if not ok else {})},
    )  # fmt: skip
    assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


FAULT_KILL = {"PAPERSCALE_FAULT_KILL_AT_STEP": "1"}  # dies after step 1, before any save


def kept_line(out: str, picked: str, other: str) -> str:
    lines = [x for x in out.splitlines() if x.startswith("precision auto -> ")]
    assert len(lines) == 1, out
    assert lines[0].startswith(
        f"precision auto -> {picked}: as the run's first start decided (PAPERSCALE_CPU_BF16="
    ), lines[0]
    assert f"this machine alone would pick {other}: " in lines[0], lines[0]
    return lines[0]


def saved_precision(run_dir: Path) -> str:
    return str(OmegaConf.load(run_dir / "config.yaml").train.precision)


@pytest.mark.parametrize(("first", "second"), [("1", "0"), ("0", "1")])
def test_resume_keeps_the_checkpoints_precision(
    synthetic_data: Path, tmp_path: Path, first: str, second: str
) -> None:
    run = tmp_path / "run"
    out = train(run, synthetic_data, 2, first, tmp_path)
    picked = PICKS[first]
    lines = [x for x in out.splitlines() if x.startswith("precision auto -> ")]
    assert lines == [f"precision auto -> {picked}: " + lines[0].split(": ", 1)[1]]
    assert FORCED[first] in lines[0]
    assert saved_precision(run) == picked
    assert json.loads((run / "summary.json").read_text())["precision"] == picked
    meta = json.loads((run / "checkpoints/step_00000002/meta.json").read_text())
    assert meta["config"]["train"]["precision"] == picked

    assert decided(run)["precision"] == picked

    out = train(run, synthetic_data, 4, second, tmp_path)
    kept_line(out, picked, PICKS[second])
    assert "resumed from" in out and saved_precision(run) == picked
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
    status = paperscale("status", str(run), cwd=tmp_path)
    assert status.returncode == 0 and f"precision        {picked}" in status.stdout
    assert f"decided          device cpu (auto), precision {picked} (auto), attention " in (
        status.stdout
    )


def test_a_start_before_any_checkpoint_keeps_the_first_starts_decision(
    synthetic_data: Path, tmp_path: Path
) -> None:
    """The first start decides bf16 (and one loader worker) and dies after step 1, before its
    first save; the next start, where this machine alone would pick fp32, trains in bf16 from
    the record and says so."""
    run = tmp_path / "run"
    workers = "data.num_workers=auto"  # (TINY_MODEL sets 0) decided too, and kept alike
    train(run, synthetic_data, 2, "1", tmp_path, workers, ok=False)
    assert not (run / "checkpoints/latest").exists()
    assert decided(run) == {
        "device": "cpu",
        "precision": "bf16",
        "attention": "math",
        "grad_accum_dtype": "bf16",  # one micro-batch a step: nothing summed
        "compile": "false",
        "num_workers": "1",
    }
    out = train(run, synthetic_data, 2, "0", tmp_path, workers)
    kept_line(out, "bf16", "fp32")
    assert (
        "num_workers auto -> 1: a CPU: one worker per rank reads ahead while the rank "
        "computes (as the run's first start decided)" in out
    )
    assert "attention auto -> math: " in out and decided(run)["precision"] == "bf16"
    assert json.loads((run / "summary.json").read_text())["precision"] == "bf16"


DEMO_MODEL = [  # configs/tiny.yaml's model: d_model 256, 3 + 3 layers, not a toy
    "model.d_model=256", "model.n_heads=4", "model.d_ff=1024", "model.encoder_layers=3",
    "model.decoder_layers=3",
]  # fmt: skip


@pytest.mark.serial  # MFU is a speed: measured alone
def test_mfu_lies_in_0_1_at_the_demo_model_size(synthetic_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "2",
        "--run-dir", str(run), f"data.dir={synthetic_data}", *TINY_MODEL, *DEMO_MODEL,
        "data.max_tokens=1536", "train.precision=auto", "train.grad_accum=1",
        "train.log_every=1", "train.eval_every=0", "train.save_every=0", "train.max_steps=6",
        "train.bleu_samples=4", "train.bleu_beam=1", "logging.wandb=disabled",
        "logging.tensorboard=false",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    mfu = [r["mfu"] for r in records if "loss" in r]
    assert len(mfu) == 6
    assert all(0 < m <= 1 for m in mfu), mfu
