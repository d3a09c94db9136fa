"""Ranks forked from a preloaded torchrun agent (CPU runs' default, launch/agent.py) and ranks
started as new interpreters (PAPERSCALE_RANK_START=exec, as on GPU nodes) train alike, and a
forked rank is a process of its own as an exec'd one is."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL, assert_same_decisions, logged_losses, paperscale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 6
MARK = "PAPERSCALE_TEST_RANK_START"


def train(run_dir: Path, data: Path, cwd: Path, env: dict[str, str]) -> str:
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "2",
        "--run-dir", str(run_dir), f"data.dir={data}", *TINY_MODEL, "train.zero_stage=2",
        "train.log_every=1", "train.eval_every=0", "train.save_every=3",
        "train.bleu_samples=4", "train.bleu_beam=1", f"train.max_steps={STEPS}",
        cwd=cwd, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def marked(token: str) -> dict[int, dict[str, object]]:
    """pid -> {ppid, sid, cmdline, fds} of every process whose environment holds MARK=token."""
    out: dict[int, dict[str, object]] = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        proc = environ.parent
        try:
            if f"{MARK}={token}".encode() not in environ.read_bytes().split(b"\0"):
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            fds = set()
            for fd in (proc / "fd").iterdir():
                try:
                    fds.add(os.readlink(fd))
                except OSError:
                    continue
            out[int(proc.name)] = {
                "ppid": int(fields[1]), "sid": int(fields[3]), "fds": fds,
                "cmdline": (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(),
            }  # fmt: skip
        except (OSError, ValueError):
            continue  # gone, or not ours
    return out


def ranks_while_training(run_dir: Path, token: str, timeout: float = 300) -> dict[int, dict]:
    """The agent's children once rank 0 logged step 2 (the ranks rest from there on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file() and len(logged_losses(run_dir)) >= 2:
            procs = marked(token)
            forks = {p for p, i in procs.items() if "launch.agent" in str(i["cmdline"])}
            agents = [p for p in forks if procs[p]["ppid"] not in forks]  # the ranks' parent
            ranks = {p: i for p, i in procs.items() if agents and i["ppid"] == agents[0]}
            if len(agents) == 1 and len(ranks) == 2:
                return ranks
        time.sleep(0.2)
    raise AssertionError("the run did not reach step 2")


def test_forked_and_exec_ranks_train_alike_and_a_forked_rank_is_its_own_process(
    synthetic_data: Path, tmp_path: Path
) -> None:
    token = uuid.uuid4().hex
    forked = tmp_path / "forked"
    slow = {MARK: token, "PAPERSCALE_FAULT_SLOW_FROM_STEP": "2:1.0:5"}
    seen: dict[str, object] = {}
    watcher = threading.Thread(
        target=lambda: seen.update(ranks=ranks_while_training(forked, token)), daemon=True
    )
    watcher.start()
    train(forked, synthetic_data, tmp_path, slow)
    watcher.join(timeout=10)
    ranks = seen["ranks"]
    assert isinstance(ranks, dict) and len(ranks) == 2, ranks
    lock = str(forked / ".lock")
    for pid, info in ranks.items():
        assert info["sid"] == pid, info  # a session of its own, as torchrun starts a rank
        assert lock not in info["fds"], info  # the launcher and the agent hold the run
        assert "launch.agent" in info["cmdline"], info  # a fork: the agent's command line
    execd = tmp_path / "exec"
    train(execd, synthetic_data, tmp_path, {"PAPERSCALE_RANK_START": "exec"})
    assert_same_decisions(execd, forked)
    assert len(logged_losses(forked)) == STEPS
    assert logged_losses(execd) == logged_losses(forked)  # bitwise
