"""End to end on 2 CPU ranks: torchrun + the real DeepSpeed engine, then translate and evaluate."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL, TRACKED, paperscale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@contextlib.contextmanager
def held_port(port: int) -> Iterator[int]:
    """Listen on `port` (or on a free one where something else has it already)."""
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            sock.bind(("", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_two_ranks_train_resume_translate_evaluate(synthetic_data: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    common = [
        "train",
        "--config",
        str(ROOT / "configs/tiny.yaml"),
        "--nproc",
        "2",
        "--run-dir",
        str(run_dir),
        f"data.dir={synthetic_data}",
        *TINY_MODEL,
        *TRACKED,
        "train.grad_accum=2",
        "train.zero_stage=2",
        "train.precision=bf16",
        "train.log_every=2",
        "train.eval_every=4",
        "train.save_every=4",
        "train.bleu_samples=16",
    ]
    # torch's default port and the environment's MASTER_PORT are taken: the local launcher's
    # rendezvous (and the ranks' process group) use free ports, not fixed ones
    with held_port(29500) as port:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        proc = paperscale(*common, "train.max_steps=8", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    records = metrics(run_dir)
    steps = [r["step"] for r in records]
    assert steps == sorted(set(steps)) and steps[-1] == 8
    assert all(
        r["loss"] > 0 and r["lr"] > 0 and r["tokens_per_s"] > 0 for r in records if "loss" in r
    )
    # the share of each window the ranks waited for batches: a share, on every logged step
    assert all(0 <= r["data_wait_pct"] < 100 for r in records if "loss" in r), records
    final = records[-1]
    assert "valid_loss" in final and "bleu" in final
    assert (run_dir / "checkpoints/latest").read_text().strip() == "step_00000008"
    assert (run_dir / "model/model.safetensors").is_file()
    assert (run_dir / "config.yaml").is_file()
    assert list((run_dir / "wandb").glob("offline-run-*")), "wandb offline run dir missing"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 8

    # Resume: the same command with a later max_steps continues from step 8.
    proc = paperscale(*common, "train.max_steps=12", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from" in proc.stdout and "at step 8" in proc.stdout
    steps = [r["step"] for r in metrics(run_dir)]
    assert steps == sorted(set(steps)) and steps[-1] == 12
    assert (run_dir / "checkpoints/latest").read_text().strip() == "step_00000012"

    # Translate from stdin and evaluate the test split.
    lines = ["a b c", "d e f g"]
    proc = paperscale(
        "translate", str(run_dir), "--beam", "2", stdin="\n".join(lines) + "\n", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2
    proc = paperscale(
        "evaluate",
        str(run_dir),
        "--data",
        str(synthetic_data),
        "--limit",
        "16",
        "--beam",
        "2",
        "--show",
        "3",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run_dir / "eval_test.json").read_text())
    assert result["sentences"] == 16 and 0 <= result["bleu"] <= 100
    # three examples, each with its source, reference and hypothesis
    shown = proc.stdout.splitlines()
    assert sum(x.startswith("  source     ") for x in shown) == 3
    assert sum(x.startswith("  reference  ") for x in shown) == 3
    assert sum(x.startswith("  hypothesis ") for x in shown) == 3
    assert "nrefs:1" in result["bleu_signature"]

    # A damaged test shard: refused in one line (exit 2), or scored partially, loudly, on request
    damaged = tmp_path / "damaged"
    shutil.copytree(synthetic_data, damaged)
    (shard,) = sorted((damaged / "shards").glob("test-*.tar"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    common_eval = ["evaluate", str(run_dir), "--data", str(damaged), "--beam", "1"]
    proc = paperscale(*common_eval, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "the test split is damaged" in proc.stderr and str(shard) in proc.stderr
    proc = paperscale(*common_eval, "--allow-damaged", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run_dir / "eval_test.json").read_text())
    assert 0 < result["sentences"] < result["expected_sentences"] == 64
    assert "WARNING: scoring" in proc.stderr and "(PARTIAL: " in proc.stdout
