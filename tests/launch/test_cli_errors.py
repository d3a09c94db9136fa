"""Bad configs and arguments: exit 2, one line naming the key, no traceback, nothing written."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("optim.lr=-1", "optim.lr"),
        ("model.d_model=0", "model.d_model"),
        ("model.bogus=3", "model.bogus"),
        ("nosuchsection.x=1", "nosuchsection"),
        ("model.d_model=abc", "model.d_model"),
        ("model.n_heads=7", "model.d_model"),
        ("train.zero_stage=4", "train.zero_stage"),
        ("train.precision=fp8", "train.precision"),
        ("train.grad_accum=0", "train.grad_accum"),
        ("data.max_tokens=-5", "data.max_tokens"),
        ("model.dropout=1.5", "model.dropout"),
        ("logging.wandb=sometimes", "logging.wandb"),
        ("train.precision=fp16", "train.precision"),  # no GPU here
        ("train.device=cuda", "train.device"),  # no GPU here
        ("train.save_every_minutes=-1", "train.save_every_minutes"),
        ("train.bleu_beam=0", "train.bleu_beam"),
        ("train.compile=sometimes", "train.compile"),
        ("train.grad_accum_dtype=half", "train.grad_accum_dtype"),
    ],
)
def test_bad_override_exits_2_naming_the_key(
    tmp_path: Path, data_dir: Path, override: str, key: str
) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli(
        "train",
        "--config",
        str(ROOT / "configs/tiny.yaml"),
        "--run-dir",
        str(run_dir),
        f"data.dir={data_dir}",
        override,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert key in lines[0]
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()


def test_missing_data_dir_names_data_dir(tmp_path: Path) -> None:
    proc = run_cli(
        "train",
        "--config",
        str(ROOT / "configs/tiny.yaml"),
        "--nproc",
        "2",
        f"data.dir={tmp_path / 'nope'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "data.dir" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_missing_config_file(tmp_path: Path) -> None:
    proc = run_cli("train", "--config", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "--config" in proc.stderr and "missing.yaml" in proc.stderr


def test_bad_nproc(tmp_path: Path, data_dir: Path) -> None:
    proc = run_cli(
        "train",
        "--config",
        str(ROOT / "configs/tiny.yaml"),
        "--nproc",
        "0",
        f"data.dir={data_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "--nproc" in proc.stderr


def test_translate_rejects_non_model_dir(tmp_path: Path) -> None:
    proc = run_cli("translate", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    assert "export dir" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "sub", ["corpus", "prepare", "train", "translate", "evaluate", "plan", "calibrate"]
)
def test_every_subcommand_has_help(tmp_path: Path, sub: str) -> None:
    proc = run_cli(sub, "--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert "usage: paperscale" in proc.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--tokens", "0,256"], "--tokens"),
        (["--tokens", "many"], "--tokens"),
        (["--steps", "0"], "--steps"),
        (["--ranks", "0"], "--ranks"),
        (["--device", "cuda"], "--device cuda"),  # no GPU here
        (["model.d_model=0"], "model.d_model"),
    ],
)
def test_calibrate_rejects_bad_input_before_any_engine(
    tmp_path: Path, args: list[str], named: str
) -> None:
    out = tmp_path / "cal.json"
    proc = run_cli(
        "calibrate", "--config", str(ROOT / "configs/tiny.yaml"), "--out", str(out), *args,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and named in proc.stderr
    assert not out.exists()


def test_corpus_synthetic_takes_sentence_lengths_and_refuses_bad_ones(tmp_path: Path) -> None:
    """`corpus synthetic --min-len/--max-len`: words per sentence; an empty range is one line,
    exit 2, and nothing written."""
    proc = run_cli("corpus", "synthetic", "bad", "--min-len", "5", "--max-len", "3", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "paperscale: error: corpus synthetic: need vocab >= 2, 1 <= min_len <= max_len and "
        "non-negative sizes"
    ]
    assert not (tmp_path / "bad").exists()
    args = ["--train", "200", "--valid", "5", "--test", "5", "--min-len", "2", "--max-len", "4"]
    assert run_cli("corpus", "synthetic", "ok", *args, cwd=tmp_path).returncode == 0
    lines = (tmp_path / "ok" / "train.en").read_text().splitlines()
    assert len(lines) == 200 and {len(x.split()) for x in lines} == {2, 3, 4}
