"""The rendezvous port of a Slurm job's tries, and a start that fails before any rank: the node
task's record of why (a real torchrun on a port that is taken) and the batch shell's decision.
No Slurm needed (tests/integration/slurm/ runs the same under a real one)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from launch.config import load_config, to_yaml
from launch.slurm.cluster import ClusterProfile
from launch.slurm.rendezvous import (
    LOWEST_PORT,
    TRIES,
    ephemeral_range,
    first_error,
    free_port,
    port_for_try,
)
from launch.slurm.script import batch_script
from tests.integration.conftest import cli_env
from trainer.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]

TRACEBACK = """\
[W1203 07:55:42] The server socket has failed to listen on any local network address.
Traceback (most recent call last):
  File "torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 159, in _create_tcp_store
torch.distributed.DistNetworkError: The server socket has failed to listen. port: 20003, name: EADDRINUSE
The above exception was the direct cause of the following exception:
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed.
"""  # noqa: E501


def test_script_takes_a_free_port_for_every_try_never_one_from_the_job_id() -> None:
    text = batch_script("r", Path("/runs/r"), ClusterProfile(), Path("/w"), "/py")
    assert "SLURM_JOB_ID %" not in text and "MASTER_PORT=$((" not in text
    assert 'MASTER_PORT="$(/py -m launch.slurm.job port --try="$tries")" || exit $?' in text
    # the port is chosen inside the loop, after the tries counter moved on
    loop = text.index("while :; do")
    assert (
        loop
        < text.index("tries=$((tries + 1))")
        < text.index("MASTER_PORT=")
        < (text.index("srun "))
    )
    assert 'launch.slurm.job startup-failed --run-dir /runs/r --try="$tries" || break' in text
    fixed = batch_script(
        "r", Path("/runs/r"), ClusterProfile(rendezvous_port=29500), Path("/w"), "/py"
    )
    assert 'port --try="$tries" --fixed=29500)"' in fixed


def test_port_for_try_is_free_and_a_fixed_port_is_only_the_first_try() -> None:
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        ports = {port_for_try(1) for _ in range(5)}
        assert taken not in ports
        assert port_for_try(1, fixed_port=taken) == taken
        assert port_for_try(2, fixed_port=taken) != taken
    with socket.socket() as probe:
        probe.bind(("", free_port()))  # nothing listens there: it binds


def test_free_ports_come_from_below_the_ephemeral_range_and_skip_held_ones() -> None:
    """Outgoing connections take ports of the ephemeral range at any moment; not these."""
    low, _ = ephemeral_range()
    assert all(LOWEST_PORT <= free_port() < low for _ in range(20))
    first = random.Random(7).randrange(LOWEST_PORT, low)  # what the seeded choice tries first
    with socket.socket() as held:
        held.bind(("", first))
        held.listen()
        port = free_port(random.Random(7))
    assert port != first and LOWEST_PORT <= port < low


def test_first_error_is_the_root_cause_without_module_path() -> None:
    assert first_error(TRACEBACK.splitlines()) == (
        "DistNetworkError: The server socket has failed to listen. port: 20003, name: EADDRINUSE"
    )
    assert first_error(["no exception here", "  File x"]) is None


def node_task(run_dir: Path, port: int, attempt_try: int) -> subprocess.CompletedProcess:
    env = {
        **cli_env(),
        "SLURM_JOB_ID": "4242",
        "SLURM_RESTART_COUNT": "1",
        "SLURM_NODEID": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    return subprocess.run(
        [sys.executable, "-m", "launch.slurm.job", "node", "--run-dir", str(run_dir),
         "--nnodes=1", "--nproc-per-node=1", f"--try={attempt_try}"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def startup_failed(run_dir: Path, port: int, attempt_try: int) -> subprocess.CompletedProcess:
    env = {**cli_env(), "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"}
    env |= {"MASTER_ADDR": "node1", "MASTER_PORT": str(port)}
    return subprocess.run(
        [sys.executable, "-m", "launch.slurm.job", "startup-failed", "--run-dir", str(run_dir),
         f"--try={attempt_try}"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.timeout(240)
def test_torchrun_on_a_taken_port_records_why_and_the_shell_tries_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = load_config(ROOT / "configs/tiny.yaml", [f"run.dir={run_dir}"])
    (run_dir / "config.yaml").write_text(to_yaml(job))
    run = RunDir(run_dir)
    assert startup_failed(run_dir, 1, 1).returncode == 1  # nothing recorded: not a start failure
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = node_task(run_dir, port, attempt_try=1)
    assert proc.returncode != 0
    assert f"rendezvous at 127.0.0.1:{port}" in proc.stdout  # its torchrun's stderr passed on
    assert "EADDRINUSE" in proc.stderr
    (record,) = run.startup_failures("4242", "1", 1)
    assert record.name == "startup-failed-4242.1.1-node0.txt"
    assert "EADDRINUSE" in record.read_text() and record.read_text().count("\n") == 1

    again = startup_failed(run_dir, port, 1)
    assert again.returncode == 0 and again.stderr.count("\n") == 1
    assert again.stderr.startswith(f"paperscale: rendezvous at node1:{port} failed before any ")
    assert again.stderr.strip().endswith(f"trying again on a new port (try 2 of {TRIES})")
    os.rename(record, run.startup_failure("4242", "1", TRIES, "0"))
    last = startup_failed(run_dir, port, TRIES)
    assert last.returncode == 1 and last.stderr.strip().endswith(f"giving up after {TRIES} tries")


@pytest.mark.parametrize("module", ["launch.slurm.job", "launch.slurm_job"])
def test_both_entry_points_give_a_free_port(module: str) -> None:
    """launch.slurm_job is what batch scripts of earlier versions call (Slurm keeps a queued
    job's script): it runs the same steps as launch.slurm.job."""
    proc = subprocess.run(
        [sys.executable, "-m", module, "port", "--try=2"],
        env=cli_env(), capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    port = int(proc.stdout.strip())
    with socket.socket() as s:
        s.bind(("", port))  # free: nothing listens there
