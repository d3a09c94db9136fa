"""A real local Slurm for the tests in this folder, started once per session.

Installs slurm-wlm and munge when missing (apt-get, root), starts munged, slurmctld and slurmd
with their own config, ports and spool dirs in a temp dir, waits for the node to be idle, and
stops every daemon by its pid at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import cli_env
from tests.integration.slurm.cluster import LocalSlurm, ensure_installed

ROOT = Path(__file__).resolve().parents[3]
JOB_ID_PORTS = 40


def job_id_port(job_id: int) -> int:
    """The rendezvous port that job ids once gave (20000 + id % 20000): a port that another
    job, an earlier attempt of the same job or any other program could hold."""
    return 20000 + job_id % 20000


@pytest.fixture(scope="session")
def slurm() -> Iterator[LocalSlurm]:
    """The cluster, with the job-id ports of its first JOB_ID_PORTS jobs held by listening
    sockets for the whole session: every job of the tests rendezvouses beside a held one."""
    notes: list[str] = []
    ensure_installed(notes)
    cluster = LocalSlurm()
    started = time.monotonic()
    try:
        cluster.start()
        ids = range(cluster.first_job_id, cluster.first_job_id + JOB_ID_PORTS)
        held = cluster.hold_ports([job_id_port(i) for i in ids])
        notes.append(f"local Slurm up in {time.monotonic() - started:.1f} s")
        notes.append(f"{len(held)} job-id ports held")
        print("; ".join(notes), file=sys.stderr)
        yield cluster
    finally:
        cluster.stop()


def job_fields(cluster: LocalSlurm, job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as a dict (JobState, Restarts, ExitCode, NodeList, ...)."""
    from launch.slurm.submit import parse_scontrol

    return parse_scontrol(cluster.query(["scontrol", "show", "job", "-o", job_id]) or "")


def wait_for(
    cluster: LocalSlurm,
    job_id: str,
    done: Callable[[dict[str, str]], bool],
    timeout: float,
    what: str,
    log: Path | None = None,
) -> dict[str, str]:
    """Poll the job until `done(fields)`; fail with its state, log and the daemons' logs."""
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = job_fields(cluster, job_id)
        if fields and done(fields):
            return fields
        time.sleep(0.5)
    text = log.read_text()[-3000:] if log and log.is_file() else ""
    pytest.fail(f"job {job_id}: not {what} after {timeout:.0f} s: {fields}\n{text}")


def finished(fields: dict[str, str]) -> bool:
    return fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


def submit(
    cluster: LocalSlurm,
    *args: str,
    cwd: Path,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`paperscale submit ARGS` against this cluster."""
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", "submit", *args],
        cwd=cwd,
        env={**cli_env(), "SLURM_CONF": str(cluster.conf), **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def submitted_job(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(json.loads(proc.stdout.splitlines()[-1])["job_id"])


def release_when_pending(cluster: LocalSlurm, job_id: str, log: Path) -> None:
    """A requeued job waits ~2 minutes for its BeginTime: start it as soon as the node is free
    (not within the second of the requeue: "Job credential revoked")."""
    wait_for(
        cluster,
        job_id,
        lambda f: (f.get("Restarts") == "1" and f.get("JobState") == "PENDING") or finished(f),
        300,
        "requeued",
        log,
    )
    cluster.wait_idle(300)
    time.sleep(3)
    subprocess.run(
        ["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=cluster.env(), timeout=60
    )
