"""ZeRO stage 3 trains and resumes; exports agree across stages; averaging; incomplete saves."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.conftest import TINY_MODEL, paperscale

ROOT = Path(__file__).resolve().parents[2]
NO_OVERLAP = ("train.overlap_comm=false",)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def train(
    run_dir: Path, data: Path, stage: int, max_steps: int, cwd: Path, *extra: str, nproc: int = 2
) -> str:
    """Train; returns what the run printed."""
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", str(nproc),
        "--run-dir", str(run_dir), f"data.dir={data}", *TINY_MODEL,
        "train.grad_accum=2", f"train.zero_stage={stage}", "train.precision=fp32",
        "train.log_every=1", "train.eval_every=0", "train.save_every=2", "train.keep_last=5",
        "train.bleu_samples=4", "logging.wandb=disabled", "logging.tensorboard=false",
        f"train.max_steps={max_steps}", *extra,
        cwd=cwd,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines if "loss" in json.loads(x)]


def weights(export_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(export_dir / "model.safetensors"))


def test_stage3_resumes_exactly(synthetic_data: Path, tmp_path: Path) -> None:
    """That stage 3 trains as stages 0 and 2 do is the next test's (the same weights)."""
    z3, z3r = tmp_path / "z3", tmp_path / "z3r"
    train(z3, synthetic_data, 3, 4, tmp_path)
    train(z3r, synthetic_data, 3, 2, tmp_path)
    train(z3r, synthetic_data, 3, 4, tmp_path)  # resumed at step 2

    assert len(losses(z3)) == 4 and losses(z3) == losses(z3r)  # stage 3 resume is exact


def initial_weights() -> dict[str, torch.Tensor]:
    """The seeded initial weights every run of TINY_MODEL starts from (trainer/ds/engine.py)."""
    from launch.config import load_config
    from model.config import ModelConfig
    from model.transformer import Transformer
    from trainer.ds.engine import seed_everything

    job = load_config(ROOT / "configs/tiny.yaml", [*TINY_MODEL, "model.vocab_size=96"])
    seed_everything(job.train.seed)
    model = Transformer(ModelConfig(**job.model.__dict__))
    return {k: v.detach() for k, v in model.state_dict().items() if k in weights_names(model)}


def weights_names(model: torch.nn.Module) -> set[str]:
    return {name for name, _ in model.named_parameters()}


def test_exports_from_stages_0_2_and_3_are_the_same_tensors(
    synthetic_data: Path, tmp_path: Path
) -> None:
    """Runs train the same weights (same seed, data, fp32, dropout 0) for 3 steps that
    move them; each stage's (partitioned) checkpoint is consolidated on export. The stages
    differ only in the order of their gradient reductions, a few ulp of fp32; Adam's
    normalisation would blow that up to ~lr for parameters whose gradient is near zero, so
    eps=1 makes the update ~lr * gradient, which keeps it at the ulp level.
    ZeRO 0 runs twice: reducing during the backward in ~10 buckets (trainer/ds/overlap.py)
    and, as DeepSpeed does, after it: at two ranks the sums are the same, bit for bit."""
    small_buckets = ("train.overlap_comm=true", "train.bucket_elements=3000")
    arms = {0: (0, small_buckets), 2: (2, ()), 3: (3, ()), "0 after": (0, NO_OVERLAP)}
    runs, printed = {}, {}
    for name, (stage, extra) in arms.items():
        runs[name] = tmp_path / f"z{name}".replace(" ", "-")
        printed[name] = train(
            runs[name], synthetic_data, stage, 3, tmp_path, "model.dropout=0.0", "optim.lr=0.5",
            "optim.eps=1.0", "optim.warmup_steps=1", *extra,
        )  # fmt: skip
    reduced_during = r"ZeRO 0: gradients all-reduced during the backward in \d\d bucket"
    assert re.search(reduced_during, printed[0])
    assert "during the backward" not in printed["0 after"]
    w0 = weights(runs[0] / "model")
    assert all(torch.equal(t, w0[k]) for k, t in weights(runs["0 after"] / "model").items())
    assert losses(runs[0]) == losses(runs["0 after"])
    w3 = weights(runs[3] / "model")
    start = initial_weights()
    moved = max((w3[k] - start[k]).abs().max().item() for k in start)
    assert moved > 1e-3, "the weights did not train"
    for stage in (0, 2):
        other = weights(runs[stage] / "model")
        assert other.keys() == w3.keys()
        for key in other:
            assert other[key].shape == w3[key].shape
            torch.testing.assert_close(other[key], w3[key], rtol=0, atol=1e-5)
    # Exporting the stage-3 checkpoint by hand gives the tensors written when training ended.
    proc = paperscale("export", str(runs[3]), "--out", str(tmp_path / "exp3"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for key, value in weights(tmp_path / "exp3").items():
        assert torch.equal(value, w3[key])


@pytest.mark.parametrize("stage,sums", [(0, "bf16"), (1, "fp32")])
def test_bf16_exports_the_fp32_masters(
    synthetic_data: Path, tmp_path: Path, stage: int, sums: str
) -> None:
    """bf16 keeps 16-bit weights in the module and fp32 masters in the optimizer: the export
    holds the masters, which round to exactly the module's bf16 weights. ZeRO 0 sums the two
    micro-batches' gradients in bf16 (DeepSpeed cannot otherwise); ZeRO 1 in fp32 (auto), through
    DeepSpeed's BF16_Optimizer, whose partitions the export merges itself, and which resumes
    exactly."""
    run = tmp_path / f"z{stage}"
    train(run, synthetic_data, stage, 2, tmp_path, "train.precision=bf16")
    decided = json.loads((run / "decisions.json").read_text())["decisions"]
    assert decided["grad_accum_dtype"]["value"] == sums, decided["grad_accum_dtype"]
    exported = weights(run / "model")
    (tag,) = [p for p in (run / "checkpoints").glob("step_*")]
    module = torch.load(tag / "mp_rank_00_model_states.pt", weights_only=True)["module"]
    assert exported.keys() == module.keys()
    assert all(v.dtype == torch.float32 for v in exported.values())
    for key, value in module.items():
        assert value.dtype == torch.bfloat16
        assert torch.equal(exported[key].bfloat16(), value), key
    assert any(not torch.equal(exported[k], module[k].float()) for k in module)  # not a cast
    if stage == 1:
        assert any(tag.glob("bf16_zero_pp_rank_1_*optim_states.pt"))  # BF16_Optimizer's
        straight = tmp_path / "straight"
        train(straight, synthetic_data, stage, 4, tmp_path, "train.precision=bf16")
        train(run, synthetic_data, stage, 4, tmp_path, "train.precision=bf16")  # resumed at 2
        assert len(losses(run)) == 4 and losses(run) == losses(straight)


def test_average_of_identical_checkpoints_and_incomplete_saves(
    synthetic_data: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    train(run, synthetic_data, 2, 2, tmp_path)
    ckpts = run / "checkpoints"
    # Two more checkpoints identical to step 2 (copies under later tags).
    for step in (3, 4):
        shutil.copytree(ckpts / "step_00000002", ckpts / f"step_{step:08d}")
    (ckpts / "latest").write_text("step_00000004\n")
    proc = paperscale(
        "average", str(run), "--last", "3", "--out", str(tmp_path / "avg"), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["checkpoints"] == [f"step_{s:08d}" for s in (2, 3, 4)]
    exported = weights(run / "model")
    for key, value in weights(tmp_path / "avg").items():
        assert torch.equal(value, exported[key])

    # An interrupted save (no `complete` marker, `latest` never moved) is never chosen.
    partial = ckpts / "step_00000009"
    shutil.copytree(ckpts / "step_00000004", partial)
    (partial / "complete").unlink()
    proc = paperscale(
        "average", str(run), "--last", "3", "--out", str(tmp_path / "avg2"), cwd=tmp_path
    )
    assert json.loads(proc.stdout)["checkpoints"][-1] == "step_00000004"
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "2", "--run-dir", str(run),
        f"data.dir={synthetic_data}", *TINY_MODEL, "train.zero_stage=2", "train.max_steps=5",
        "train.precision=fp32",
        "logging.wandb=disabled", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"resumed from {ckpts / 'step_00000004'}" in proc.stdout  # not the partial step 9
    assert (ckpts / "latest").read_text().strip() == "step_00000005"

    proc = paperscale("average", str(run), "--last", "99", cwd=tmp_path)
    assert proc.returncode == 2 and "--last 99" in proc.stderr
