"""A 2-node x 1-rank job: two Slurm nodes on this machine, each slurmd in its own network
namespace (own address on a bridge, own host name); torchrun's c10d rendezvous on the first node
and the gloo process group run over that network. Each node, as real ones are, lists first an
interface that reaches no other node and maps its own name to 127.0.1.1: each node task finds
the interface that routes to the other node and gives it to gloo and NCCL."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL
from tests.integration.slurm.cluster import LocalSlurm, ensure_installed
from tests.integration.slurm.conftest import finished, submit, submitted_job, wait_for
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


@pytest.mark.timeout(600)
def test_two_node_job_trains_across_namespaces(
    slurm_pair: LocalSlurm, synthetic_data: Path, tmp_path: Path
) -> None:
    profile = tmp_path / "pair.yaml"
    profile.write_text(
        "name: pair\nnodes: 2\nprocs_per_node: 1\ncpus_per_task: 1\ntime: '00:20:00'\n"
        "env:\n  OMP_NUM_THREADS: '1'\n  DS_ACCELERATOR: cpu\n"
    )
    run_dir = tmp_path / "run"
    proc = submit(
        slurm_pair,
        "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", str(profile),
        "--run-dir", str(run_dir), f"data.dir={synthetic_data}", *TINY_MODEL,
        f"train.max_steps={STEPS}", "train.log_every=1", "train.eval_every=0",
        "train.save_every=0", "train.bleu_samples=4", "logging.wandb=disabled",
        "logging.tensorboard=false", "logging.report=false",
        cwd=tmp_path,
    )  # fmt: skip
    job_id = submitted_job(proc)
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
