"""Experiment tracking on 2 CPU ranks: the values in metrics.jsonl, TensorBoard's event file and
wandb's offline run file agree; a resume continues all three; no secret from the environment
lands in the run dir; a sink that cannot start costs one warning line, not the run."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, TINY_MODEL, TRACKED, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CANARIES = {"WANDB_API_KEY": "canary-wandb-4f1c9e", "MY_SECRET_TOKEN": "canary2-77ab03"}
LOGGED = {
    "loss",
    "ppl",
    "lr",
    "grad_norm",
    "src_tokens_per_s",
    "tgt_tokens_per_s",
    "tokens_per_s",
    "mfu",
    "mem_rss_gb",
    "samples_skipped_long",
    "samples_skipped_corrupt",
    "tgt_tokens_per_step",
    "tokens_seen",
}


def run_cli(*args: str, cwd: Path, extra_env: dict[str, str]) -> tuple[int, str]:
    """`python -m launch.cli ARGS` with extra environment; (exit code, stdout + stderr)."""
    import subprocess
    import sys

    env = {**cli_env(), **extra_env}
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return proc.returncode, proc.stdout + proc.stderr


def train_args(run_dir: Path, data: Path, max_steps: int, nproc: int = 2) -> list[str]:
    return [
        "train",
        "--config",
        str(ROOT / "configs/tiny.yaml"),
        "--nproc",
        str(nproc),
        "--run-dir",
        str(run_dir),
        f"data.dir={data}",
        *TINY_MODEL,
        *TRACKED,
        "logging.report=true",
        "train.grad_accum=1",
        "train.log_every=1",
        "train.eval_every=0",
        "train.eval_max_batches=2",
        "train.save_every=4",
        "train.bleu_samples=8",
        f"train.max_steps={max_steps}",
    ]


def jsonl(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def wandb_records(path: Path) -> Iterator[object]:
    """The protobuf records of a wandb run file (leveldb-log framing: 32 KiB blocks of
    [crc32 u32, length u16, type u8] chunks after a 7-byte ':W&B' header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += room
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 2):  # FULL, FIRST
            pending = chunk
        else:  # MIDDLE, LAST
            pending += chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def wandb_history(path: Path) -> tuple[str, dict[int, dict[str, float]]]:
    """(run id, {step: logged values}) of one offline run file."""
    run_id, history = "", {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")  # type: ignore[attr-defined]
        if kind == "run":
            run_id = record.run.run_id  # type: ignore[attr-defined]
        elif kind == "history":
            hist = record.history  # type: ignore[attr-defined]
            items = {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in hist.item}
            history[int(items.get("_step", hist.step.num))] = items
    return run_id, history


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def files_containing(run_dir: Path, needles: list[str]) -> list[str]:
    hits = []
    for path in run_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path}: {n}" for n in needles if n.encode() in data]
    return hits


def test_sinks_agree_resume_continues_and_no_secret_is_written(
    synthetic_data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    rc, out = run_cli(*train_args(run_dir, synthetic_data, 6), cwd=tmp_path, extra_env=CANARIES)
    assert rc == 0, out[-4000:]
    records = jsonl(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert set(records[0]) >= LOGGED, set(records[0])
    assert "loss_scale" not in records[0]  # bf16 has no loss scaling
    assert 0 < records[-1]["mfu"] < 1 and records[-1]["mem_rss_gb"] > 0
    assert records[-1]["tokens_per_s"] == pytest.approx(
        records[-1]["src_tokens_per_s"] + records[-1]["tgt_tokens_per_s"]
    )
    assert "valid_loss" in records[-1] and "bleu" in records[-1]
    # logged every step here: the tokens seen grow by each step's source and target tokens
    seen = [r["tokens_seen"] for r in records]
    assert all(b > a for a, b in pairwise(seen))
    assert all(
        0 < r["tgt_tokens_per_step"] < b - a
        for r, (a, b) in zip(records[1:], pairwise(seen), strict=True)
    )

    # TensorBoard and wandb hold the same numbers as metrics.jsonl.
    loss = {r["step"]: r["loss"] for r in records}
    tb = dict(tensorboard_scalars(run_dir, "train/loss"))
    assert tb.keys() == loss.keys()
    assert all(tb[s] == pytest.approx(loss[s], rel=1e-6) for s in loss)
    assert tensorboard_scalars(run_dir, "valid/bleu")[-1][1] == pytest.approx(records[-1]["bleu"])
    (first_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    run_id, history = wandb_history(first_file)
    assert sorted(history) == [1, 2, 3, 4, 5, 6]
    assert all(history[s]["loss"] == loss[s] for s in loss)
    assert history[6]["valid_loss"] == records[-1]["valid_loss"]
    assert (run_dir / "report.png").stat().st_size > 10_000

    # A crash after step 6 was logged but before its checkpoint completed: resume from step 4.
    (run_dir / "checkpoints/latest").write_text("step_00000004\n")
    rc, out = run_cli(*train_args(run_dir, synthetic_data, 8), cwd=tmp_path, extra_env=CANARIES)
    assert rc == 0, out[-4000:]
    assert "at step 4" in out
    steps = [r["step"] for r in jsonl(run_dir)]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8]
    tb_steps = [s for s, _ in tensorboard_scalars(run_dir, "train/loss")]
    assert tb_steps == [1, 2, 3, 4, 5, 6, 7, 8]  # the first run's 5 and 6 were purged
    run_files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(run_files) == 2
    resumed_id, resumed = wandb_history(next(f for f in run_files if f != first_file))
    assert resumed_id == run_id and all(f.name == f"run-{run_id}.wandb" for f in run_files)
    assert sorted(resumed) == [5, 6, 7, 8]

    # No secret from the environment in any file of the run dir, binary files included.
    assert files_containing(run_dir, list(CANARIES.values())) == []


def test_a_wandb_dir_that_cannot_be_written_costs_one_warning(
    synthetic_data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb").write_text("a file where wandb wants its directory")
    rc, out = run_cli(
        *train_args(run_dir, synthetic_data, 2, nproc=1),
        "train.save_every=0",
        cwd=tmp_path,
        extra_env={"WANDB_SILENT": "false"},
    )
    assert rc == 0, out[-4000:]
    warnings = [line for line in out.splitlines() if line.lower().startswith("warning:")]
    assert len(warnings) == 1 and "metrics sink 'wandb'" in warnings[0], warnings
    assert [r["step"] for r in jsonl(run_dir)] == [1, 2]
    assert tensorboard_scalars(run_dir, "train/loss")[-1][0] == 2
    assert os.path.isfile(run_dir / "wandb")
