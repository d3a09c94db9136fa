"""`paperscale submit` on a real local Slurm: a job trains to completion; a preempted job saves,
requeues itself, resumes and ends with the same per-step losses and one wandb run id; a bad
config fails the job at once, without a requeue loop.

2 CPU ranks on one node, the tiny model, 36 steps.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_MODEL, assert_same_decisions, cli_env
from tests.integration.slurm.cluster import LocalSlurm
from tests.integration.slurm.conftest import (
    finished,
    job_fields,
    job_id_port,
    release_when_pending,
    submit,
    submitted_job,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # one local Slurm

STEPS = 36
JOB_ARGS = [
    *TINY_MODEL,
    f"train.max_steps={STEPS}",
    "train.log_every=1",
    "train.eval_every=0",
    "train.save_every=12",
    "train.bleu_samples=8",
    "logging.tensorboard=false",
    "logging.report=false",
]


def submit_tiny(
    cluster: LocalSlurm,
    data: Path,
    run_dir: Path,
    extra_env: dict[str, str] | None = None,
    *options: str,
    overrides: tuple[str, ...] = (),
) -> str:
    proc = submit(
        cluster,
        "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", "local", *options,
        "--run-dir", str(run_dir), f"data.dir={data}", *JOB_ARGS, *overrides,
        cwd=run_dir.parent, extra_env=extra_env,
    )  # fmt: skip
    return submitted_job(proc)


def stopped_step(log_text: str) -> int:
    """The step a signal stopped the job at, from its log (the log's tail when it has none)."""
    found = re.search(r"stopped at step (\d+) after a signal", log_text)
    assert found, f"no 'stopped at step N after a signal' in the job's log:\n{log_text[-3000:]}"
    return int(found[1])


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir) if r.get("loss") is not None}


def rendezvous_ports(log_text: str) -> list[int]:
    """The port of every try's rendezvous, in order, as the node tasks logged them."""
    return [int(p) for p in re.findall(r"rendezvous at \S+:(\d+)\n", log_text)]


def wandb_ids(run_dir: Path) -> list[str]:
    """One entry per wandb run directory (one per start of the job): the run id of each."""
    return [p.name.rsplit("-", 1)[1] for p in sorted(run_dir.glob("wandb/offline-run-*"))]


@pytest.fixture(scope="module")
def straight_run(
    slurm: LocalSlurm, synthetic_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str, dict[str, str]]:
    """An uninterrupted job; its losses are the reference of the preemption test."""
    run_dir = tmp_path_factory.mktemp("slurm-straight") / "run"
    job_id = submit_tiny(slurm, synthetic_data, run_dir)
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    fields = wait_for(slurm, job_id, finished, 420, "finished", log)
    return run_dir, job_id, fields


@pytest.mark.timeout(600)
def test_submitted_job_trains_to_completion(
    slurm: LocalSlurm, straight_run: tuple[Path, str, dict[str, str]]
) -> None:
    run_dir, job_id, fields = straight_run
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    assert fields["JobState"] == "COMPLETED", (fields, log.read_text()[-3000:])
    assert fields["ExitCode"] == "0:0" and fields["Restarts"] == "0"
    assert (run_dir / "job.sbatch").read_text().startswith("#!/bin/bash")
    assert (run_dir / "config.yaml").is_file()
    text = log.read_text()
    assert f"slurm job {job_id} (restart 0)" in text and "summary: " in text
    # the port job ids used to give is held by another program all along: not used
    assert job_id_port(int(job_id)) in slurm.held
    (port,) = rendezvous_ports(text)
    assert port not in slurm.held and "failed before any rank started" not in text
    assert [r["step"] for r in metrics(run_dir) if "loss" in r] == list(range(1, STEPS + 1))
    assert (run_dir / "checkpoints/latest").read_text().strip() == f"step_{STEPS:08d}"
    assert (run_dir / "model/model.safetensors").is_file()
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == STEPS

    status = subprocess.run(
        [sys.executable, "-m", "launch.cli", "status", str(run_dir)],
        env={**cli_env(), "SLURM_CONF": str(slurm.conf)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert re.search(rf"slurm job +{job_id} COMPLETED \(restarts 0", status.stdout), status.stdout
    assert re.search(rf"last step +{STEPS}\n", status.stdout), status.stdout
    assert re.search(rf"last checkpoint +step_{STEPS:08d}", status.stdout), status.stdout


@pytest.mark.timeout(900)
def test_preempted_job_requeues_and_matches_the_straight_run(
    slurm: LocalSlurm,
    synthetic_data: Path,
    tmp_path: Path,
    straight_run: tuple[Path, str, dict[str, str]],
) -> None:
    run_dir = tmp_path / "run"
    job_id = submit_tiny(slurm, synthetic_data, run_dir, overrides=("logging.wandb=offline",))
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    deadline = time.monotonic() + 420
    while len(losses(run_dir)) < 6:
        assert not finished(job_fields(slurm, job_id)), log.read_text()[-3000:]
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)
    # What Slurm does before the time limit with --signal=B:USR1@N: USR1 to the batch shell.
    subprocess.run(
        ["scancel", "--signal=USR1", "--batch", job_id], env=slurm.env(), check=True, timeout=60
    )
    # A requeued job waits for its BeginTime (Slurm holds it ~2 minutes, so that the first run
    # has left the node); a few seconds after the requeue, start it now (a start within the
    # second of the requeue fails: "Job credential revoked").
    wait_for(
        slurm,
        job_id,
        lambda f: (f.get("Restarts") == "1" and f.get("JobState") == "PENDING") or finished(f),
        300,
        "requeued",
        log,
    )
    # The first attempt's port stays taken (as by its store still shutting down, or by the
    # next program that grabbed it): the requeued attempt, same job id, must not need it.
    (first_port,) = rendezvous_ports(log.read_text())
    assert slurm.hold_ports([first_port]) and first_port in slurm.held
    slurm.wait_idle(120)
    time.sleep(3)
    subprocess.run(
        ["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=slurm.env(), timeout=60
    )
    fields = wait_for(slurm, job_id, finished, 420, "finished", log)
    text = log.read_text()
    assert fields["JobState"] == "COMPLETED", f"{fields}\n{text[-2000:]}\n{slurm.logs(6000)}"
    assert fields["Restarts"] == "1"
    stopped = stopped_step(text)
    assert 6 <= stopped < STEPS
    assert "SIGUSR1 received" in text and f"requeueing job {job_id}" in text
    assert f"slurm job {job_id} (restart 1)" in text
    assert f"at step {stopped}" in text  # resumed from the checkpoint the signal saved
    assert rendezvous_ports(text)[0] == first_port and len(rendezvous_ports(text)) == 2
    assert "failed before any rank started" not in text

    assert_same_decisions(run_dir, straight_run[0])
    straight, resumed = losses(straight_run[0]), losses(run_dir)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert [resumed[s] for s in sorted(resumed)] == [straight[s] for s in sorted(straight)]
    ids = wandb_ids(run_dir)
    assert len(ids) == 2 and len(set(ids)) == 1, ids  # two starts, one wandb run


@pytest.mark.timeout(420)
def test_a_taken_rendezvous_port_costs_one_try_not_the_job(
    slurm: LocalSlurm, synthetic_data: Path, tmp_path: Path
) -> None:
    """A profile's fixed rendezvous port that another program holds: the first try fails
    before any rank starts, says so in one line, and the job trains on a new port."""
    (taken,) = slurm.hold_ports([job_id_port(slurm.first_job_id + 999)])
    profile = tmp_path / "fixed-port.yaml"
    profile.write_text(
        (ROOT / "configs/clusters/local.yaml").read_text() + f"rendezvous_port: {taken}\n"
    )
    run_dir = tmp_path / "run"
    proc = submit(
        slurm,
        "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", str(profile),
        "--run-dir", str(run_dir), f"data.dir={synthetic_data}", *TINY_MODEL,
        "train.max_steps=3", "train.eval_every=0", "train.bleu_samples=4",
        "logging.wandb=disabled", "logging.tensorboard=false", "logging.report=false",
        cwd=tmp_path,
    )  # fmt: skip
    job_id = submitted_job(proc)
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    fields = wait_for(slurm, job_id, finished, 360, "finished", log)
    text = log.read_text()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "0", (fields, text[-3000:])
    ports = rendezvous_ports(text)
    assert len(ports) == 2 and ports[0] == taken and ports[1] not in slurm.held, ports
    (line,) = [x for x in text.splitlines() if "failed before any rank started" in x]
    assert line.startswith("paperscale: rendezvous at ") and f":{taken} failed" in line
    assert "EADDRINUSE" in line and line.endswith("trying again on a new port (try 2 of 3)")
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3


@pytest.mark.timeout(300)
def test_bad_config_fails_at_once_without_requeue(
    slurm: LocalSlurm, synthetic_data: Path, tmp_path: Path
) -> None:
    # submit validates first: exit 2, one line, nothing written, nothing queued
    before = slurm.query(["squeue", "-h", "-o", "%i"])
    proc = submit(
        slurm,
        "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", "local",
        "--run-dir", str(tmp_path / "rejected"), f"data.dir={synthetic_data}", "optim.lr=-1",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "optim.lr" in proc.stderr
    assert not (tmp_path / "rejected").exists()
    assert slurm.query(["squeue", "-h", "-o", "%i"]) == before

    # a config that goes bad after submission fails inside the job, at once
    run_dir = tmp_path / "run"
    job_id = submit_tiny(slurm, synthetic_data, run_dir, extra_env={"SBATCH_HOLD": "1"})
    config = run_dir / "config.yaml"
    config.write_text(re.sub(r"(?m)^  lr: .*$", "  lr: -1.0", config.read_text()))
    subprocess.run(["scontrol", "release", job_id], env=slurm.env(), check=True, timeout=60)
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    fields = wait_for(slurm, job_id, finished, 240, "finished", log)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "2:0", fields
    text = log.read_text()
    assert "paperscale: error: optim.lr: must be > 0" in text, text
    assert "step 1 " not in text and "srun" not in text
    time.sleep(3)
    fields = job_fields(slurm, job_id)
    assert fields["JobState"] == "FAILED" and fields["Restarts"] == "0", fields


@pytest.mark.timeout(420)
def test_time_limit_warning_saves_and_requeues(
    slurm: LocalSlurm, synthetic_data: Path, tmp_path: Path
) -> None:
    """The real `--signal=B:USR1@60` of a job with a 3-minute limit: Slurm itself sends USR1,
    one to two minutes into the job (Slurm sends it up to a minute early). After the first
    steps: a stop before the first step has nothing to save, and with a 2-minute limit a job
    whose start took ~55 s on a loaded 2-core machine got its signal before step 1. From step 3
    rank 0 rests 0.5 s after each step (its peer waits in the next collective): the minutes
    until the signal cost the machine's other tests little CPU."""
    profile = tmp_path / "short.yaml"
    profile.write_text(
        "name: short\nprocs_per_node: 2\ncpus_per_task: 2\ntime: '3'\nsignal_seconds: 60\n"
        "env:\n  OMP_NUM_THREADS: '1'\n  DS_ACCELERATOR: cpu\n"
    )
    run_dir = tmp_path / "run"
    proc = submit(
        slurm,
        "--config", str(ROOT / "configs/tiny.yaml"), "--cluster", str(profile),
        "--run-dir", str(run_dir), f"data.dir={synthetic_data}", *TINY_MODEL,
        "train.max_steps=1000000", "train.log_every=50", "train.eval_every=0",
        "logging.wandb=disabled", "logging.tensorboard=false", "logging.report=false",
        cwd=tmp_path, extra_env=fault_env(rank="0", slow_from_step="3:0.5"),
    )  # fmt: skip
    job_id = submitted_job(proc)
    assert "#SBATCH --signal=B:USR1@60\n" in (run_dir / "job.sbatch").read_text()
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    try:
        wait_for(
            slurm, job_id, lambda f: f.get("Restarts") == "1" or finished(f), 360, "requeued", log
        )
    finally:
        subprocess.run(["scancel", job_id], env=slurm.env(), timeout=60)
    text = log.read_text()
    stopped = stopped_step(text)
    assert "SIGUSR1 received" in text and f"requeueing job {job_id}" in text
    assert (run_dir / "checkpoints/latest").read_text().strip() == f"step_{stopped:08d}"
    assert "TIMEOUT" not in text


def wait_for_steps(cluster: LocalSlurm, job_id: str, run_dir: Path, n: int) -> None:
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    deadline = time.monotonic() + 420
    while len(losses(run_dir)) < n:
        assert not finished(job_fields(cluster, job_id)), log.read_text()[-3000:]
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)


@pytest.mark.timeout(1200)
def test_preempted_by_a_higher_partition_resumes_and_matches_the_straight_run(
    slurm: LocalSlurm,
    synthetic_data: Path,
    tmp_path: Path,
    straight_run: tuple[Path, str, dict[str, str]],
) -> None:
    """Slurm's own preemption (partition_prio, REQUEUE): TERM to every process of the job, no
    USR1 first. The job saves the step it is at, exits, is requeued by Slurm, resumes after
    the high-priority job ended and finishes with the uninterrupted job's losses."""
    run_dir = tmp_path / "run"
    # slowed from step 6 to step 19, so that the preemption finds it training (36 steps could
    # end before Slurm schedules the high-priority job); the resumed attempt runs the rest fast
    slow = {"PAPERSCALE_FAULT_SLOW_FROM_STEP": "6:1.0:20"}
    job_id = submit_tiny(
        slurm, synthetic_data, run_dir, slow, "--partition", "low",
        overrides=("logging.wandb=offline",),
    )  # fmt: skip
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    wait_for_steps(slurm, job_id, run_dir, 6)
    high = subprocess.run(
        ["sbatch", "--parsable", "--partition=high", "--cpus-per-task=1", "--output=/dev/null",
         "--wrap", "sleep 3"],
        env=slurm.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert high.returncode == 0, high.stderr
    high_id = high.stdout.strip().split(";")[0]
    wait_for(slurm, high_id, finished, 300, "finished (the high-priority job)")
    release_when_pending(slurm, job_id, log)
    fields = wait_for(slurm, job_id, finished, 420, "finished", log)
    text = log.read_text()
    assert fields["JobState"] == "COMPLETED", f"{fields}\n{text[-2000:]}\n{slurm.logs(6000)}"
    assert fields["Restarts"] == "1"
    stopped = stopped_step(text)
    assert 6 <= stopped < STEPS and "SIGTERM received" in text
    assert f"slurm job {job_id} (restart 1)" in text and f"at step {stopped}" in text
    assert_same_decisions(run_dir, straight_run[0])
    straight, resumed = losses(straight_run[0]), losses(run_dir)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert [resumed[s] for s in sorted(resumed)] == [straight[s] for s in sorted(straight)]
    ids = wandb_ids(run_dir)
    assert len(ids) == 2 and len(set(ids)) == 1, ids  # two starts, one wandb run


@pytest.mark.timeout(1200)
def test_scancel_saves_and_a_new_submit_resumes_from_there(
    slurm: LocalSlurm,
    synthetic_data: Path,
    tmp_path: Path,
    straight_run: tuple[Path, str, dict[str, str]],
) -> None:
    """Plain `scancel` (TERM to every process, no requeue): the job saves the step it is at;
    submitting the same run dir again resumes from exactly there."""
    run_dir = tmp_path / "run"
    job_id = submit_tiny(slurm, synthetic_data, run_dir)
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    wait_for_steps(slurm, job_id, run_dir, 6)
    subprocess.run(["scancel", job_id], env=slurm.env(), check=True, timeout=60)
    fields = wait_for(slurm, job_id, finished, 120, "cancelled", log)
    assert fields["JobState"] == "CANCELLED", fields
    text = log.read_text()
    stopped = stopped_step(text)
    assert 6 <= stopped < STEPS and "requeueing" not in text
    assert (run_dir / "checkpoints/latest").read_text().strip() == f"step_{stopped:08d}"

    slurm.wait_idle(120)
    again = submit_tiny(slurm, synthetic_data, run_dir)
    log = run_dir / "logs" / f"slurm-{again}.out"
    fields = wait_for(slurm, again, finished, 420, "finished", log)
    assert fields["JobState"] == "COMPLETED", log.read_text()[-3000:]
    assert f"resumed from {run_dir / 'checkpoints'}" in log.read_text()
    assert f"at step {stopped}" in log.read_text()
    assert_same_decisions(run_dir, straight_run[0])
    straight, resumed = losses(straight_run[0]), losses(run_dir)
    assert [resumed[s] for s in sorted(resumed)] == [straight[s] for s in sorted(straight)]


def fault_env(**faults: str) -> dict[str, str]:
    return {f"PAPERSCALE_FAULT_{k.upper()}": v for k, v in faults.items()}


@pytest.mark.timeout(900)
def test_a_rank_killed_in_a_job_is_restarted_in_place(
    slurm: LocalSlurm,
    synthetic_data: Path,
    tmp_path: Path,
    straight_run: tuple[Path, str, dict[str, str]],
) -> None:
    """SIGKILL of rank 1 after step 14: torchrun restarts the group inside the same job, from
    the checkpoint of step 12; the job completes without a requeue, with the straight run's
    losses."""
    run_dir = tmp_path / "run"
    job_id = submit_tiny(slurm, synthetic_data, run_dir, fault_env(rank="1", kill_at_step="14"))
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    fields = wait_for(slurm, job_id, finished, 600, "finished", log)
    text = log.read_text()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "0", (fields, text[-3000:])
    assert "fault injected: rank 1 SIGKILL after step 14" in text
    assert "attempt 2: the worker group restarted in place (restart 1 of " in text
    assert "at step 12" in text
    assert_same_decisions(run_dir, straight_run[0])
    straight, got = losses(straight_run[0]), losses(run_dir)
    assert [got[s] for s in sorted(got)] == [straight[s] for s in sorted(straight)]


@pytest.mark.timeout(1200)
def test_a_node_whose_processes_all_die_is_requeued_and_resumes(
    slurm: LocalSlurm,
    synthetic_data: Path,
    tmp_path: Path,
    straight_run: tuple[Path, str, dict[str, str]],
) -> None:
    """Every process of the job's step killed (as when its node is lost): no torchrun is left
    to restart anything; the batch shell requeues the job, which resumes from the latest
    checkpoint and ends with the straight run's losses."""
    run_dir = tmp_path / "run"
    job_id = submit_tiny(slurm, synthetic_data, run_dir)
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    wait_for_steps(slurm, job_id, run_dir, 14)
    subprocess.run(
        ["scancel", "--signal=KILL", f"{job_id}.0"], env=slurm.env(), check=True, timeout=60
    )
    release_when_pending(slurm, job_id, log)
    fields = wait_for(slurm, job_id, finished, 600, "finished", log)
    text = log.read_text()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", (fields, text[-3000:])
    assert (
        "the job's step failed (exit " in text and f"requeueing job {job_id} (requeue 1 of" in text
    )
    assert f"slurm job {job_id} (restart 1)" in text and "at step 12" in text
    assert_same_decisions(run_dir, straight_run[0])
    straight, got = losses(straight_run[0]), losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == [straight[s] for s in sorted(straight)]


@pytest.mark.timeout(900)
def test_a_crash_loop_ends_the_job_with_its_code_and_no_requeue(
    slurm: LocalSlurm, synthetic_data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    env = fault_env(rank="1", kill_at_step=",".join(["14"] * 7))
    job_id = submit_tiny(
        slurm, synthetic_data, run_dir, env,
        overrides=("train.max_restarts=6", "train.crash_loop_attempts=3"),
    )  # fmt: skip
    log = run_dir / "logs" / f"slurm-{job_id}.out"
    fields = wait_for(slurm, job_id, finished, 800, "finished", log)
    text = log.read_text()
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "70:0", (fields, text[-3000:])
    assert text.count("paperscale: error: crash loop: the last 3 attempts resumed from ") == 1
    assert "requeueing" not in text
    time.sleep(3)
    assert job_fields(slurm, job_id)["Restarts"] == "0"
