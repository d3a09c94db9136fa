"""A 2-node x 1-rank job: two Slurm nodes on this machine, each slurmd in its own network
namespace (own address on a bridge, own host name); torchrun's c10d rendezvous on the first node
and the gloo process group run over that network. Each node, as real ones are, lists first an
interface that reaches no other node and maps its own name to 127.0.1.1: each node task finds
the interface that routes to the other node and gives it to gloo and NCCL."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL
from tests.integration.slurm.cluster import LocalSlurm, ensure_installed
from tests.integration.slurm.conftest import (
    finished,
    release_when_pending,
    submit,
    submitted_job,
    wait_for,
)
from trainer.checkpoint.disk import saved_world_size

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # one local Slurm
STEPS = 12


@pytest.fixture(scope="module")
def slurm_pair() -> Iterator[LocalSlurm]:
    ensure_installed([])
    cluster = LocalSlurm(netns_nodes=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def submit_pair(
    cluster: LocalSlurm, data: Path, tmp_path: Path, *overrides: str, profile_lines: str = ""
) -> tuple[Path, str]:
    """A 2-node x 1-rank job of the tiny preset; its run dir and job id."""
    profile = tmp_path / "pair.yaml"
    profile.write_text(
        "name: pair\nnodes: 2\nprocs_per_node: 1\ncpus_per_task: 1\ntime: '00:20:00'\n"
        "env:\n  OMP_NUM_THREADS: '1'\n  DS_ACCELERATOR: cpu\n" + profile_lines
    )
    run_dir = tmp_path / "run"
    proc = submit(
        cluster,
        "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", str(profile),
        "--run-dir", str(run_dir), f"data.dir={data}", *TINY_MODEL,
        f"train.max_steps={STEPS}", "train.log_every=1", "train.eval_every=0",
        "train.save_every=0", "train.bleu_samples=4", "logging.wandb=disabled",
        "logging.tensorboard=false", "logging.report=false", *overrides,
        cwd=tmp_path,
    )  # fmt: skip
    return run_dir, submitted_job(proc)


@pytest.mark.timeout(600)
def test_two_node_job_trains_across_namespaces(
    slurm_pair: LocalSlurm, synthetic_data: Path, tmp_path: Path
) -> None:
    run_dir, job_id = submit_pair(slurm_pair, synthetic_data, tmp_path)
    script = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "--nnodes=2 --nproc-per-node=1" in script
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    fields = wait_for(slurm_pair, job_id, finished, 480, "finished", log)
    text = log.read_text()
    assert fields["JobState"] == "COMPLETED", (fields, text[-3000:], slurm_pair.logs())
    node1, node2 = slurm_pair.nodes
    assert fields["NumNodes"] == "2"
    assert re.fullmatch(rf"{node1[:-1]}\[1-2\]|{node1},{node2}", fields["NodeList"]), fields
    assert f"step {STEPS} " in text and "summary: " in text
    # each node's task ran in its own namespace (own host name); both met on the first node
    for i, node in enumerate((node1, node2)):
        assert re.search(rf"node {node} \(node {i} of 2\): .* rendezvous at {node1}:\d+", text)
        peer, address = (node2, 3) if i == 0 else (node1, 2)
        iface = f"psv{slurm_pair.tag}{i}p"
        subnet = re.escape(slurm_pair.subnet)
        assert re.search(
            rf"node {node}: network interface {iface} \({subnet}\.{i + 2}\), the route to node "
            rf"{peer} \({subnet}\.{address}\): GLOO_SOCKET_IFNAME={iface}, "
            rf"NCCL_SOCKET_IFNAME={iface}\n",
            text,
        ), text[-3000:]
    # a checkpoint of a world of 2: one rank on each node (1 CPU, 1 task per node)
    assert saved_world_size(run_dir / "checkpoints", f"step_{STEPS:08d}") == 2


def wait_for_line(log: Path, pattern: str, after: int, timeout: float) -> tuple[float, int]:
    """Poll the log until `pattern` matches past offset `after`: (monotonic time, match end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text() if log.is_file() else ""
        if match := re.compile(pattern).search(text, after):
            return time.monotonic(), match.end()
        time.sleep(0.2)
    pytest.fail(f"no {pattern!r} in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.mark.timeout(600)
def test_a_node_that_never_joins_fails_the_step_in_time_and_requeues(
    slurm_pair: LocalSlurm, synthetic_data: Path, tmp_path: Path
) -> None:
    """Node 2's task never starts torchrun (the ABSENT_NODE fault): the rendezvous on node 1
    gives up after train.dist_timeout_s, the step fails naming node 2, and the job is requeued
    once (max_requeues 1); its second attempt fails the same way and ends the job."""
    timeout_s = 10
    run_dir, job_id = submit_pair(
        slurm_pair, synthetic_data, tmp_path, f"train.dist_timeout_s={timeout_s}",
        profile_lines="  PAPERSCALE_FAULT_ABSENT_NODE: '1'\nmax_requeues: 1\n",
    )  # fmt: skip
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    node1, node2 = slurm_pair.nodes
    absent = rf"node {node2} \(node 1\) never joined the rendezvous at {node1}:\d+ within 10 s"
    started, at = wait_for_line(log, rf"node {node1} \(node 0 of 2\): torchrun", 0, 120)
    failed, at = wait_for_line(log, absent, at, timeout_s + 60)
    print(f"never joined: named {failed - started:.1f} s after node 0 started torchrun")
    assert failed - started <= timeout_s + 30, (failed - started, log.read_text()[-3000:])
    wait_for_line(log, rf"requeueing job {job_id} \(requeue 1 of 1\)", at, 60)
    release_when_pending(slurm_pair, job_id, log)
    fields = wait_for(slurm_pair, job_id, finished, 240, "finished", log)
    text = log.read_text()
    assert fields["JobState"] == "FAILED" and fields["Restarts"] == "1", (fields, text[-3000:])
    assert len(re.findall(absent, text)) == 2, text[-3000:]  # one line per attempt
    assert "requeued 1 times (cluster profile max_requeues); not again" in text
    assert "trying again on a new port" not in text  # a missing node is not a port's fault
    assert not list((run_dir / "logs").glob("arrived-*-node1.txt"))
    assert len(list((run_dir / "logs").glob("arrived-*-node0.txt"))) == 2
    assert not (run_dir / "checkpoints" / "latest").exists()
    # no process of the job is left on either node
    deadline = time.monotonic() + 30
    while (left := subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True)).stdout:
        assert time.monotonic() < deadline, left.stdout
        time.sleep(0.5)
