"""`paperscale submit`: a run dir with an sbatch script, handed to Slurm.

The script runs one task per node with `srun`; each task starts torchrun with a c10d
rendezvous on the first node, and torchrun's workers run the same `paperscale train` as a local
run. The batch shell forwards Slurm's early-warning signal (USR1, `--signal=B:USR1@N`) to the
tasks, which pass it on to the workers: they finish the step, save a checkpoint and exit 75,
and the batch shell then requeues the job (`scontrol requeue`). A requeued job resumes from the
latest complete checkpoint in the same run dir, under the same wandb run id.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from launch.config import ConfigError, JobConfig, check_data_dir, load_config, to_yaml
from launch.preflight import check_resume
from launch.slurm.cluster import ClusterProfile, load_profile, sbatch_value_problem
from launch.slurm.script import batch_script
from trainer.run_dir import RunDir


class SubmitError(Exception):
    """Slurm refused or could not be reached; `str()` is one line for the user."""


def validate_job(job: JobConfig, profile: ClusterProfile, dry_run: bool = False) -> None:
    """What `train` checks before starting anything, for nodes with the profile's devices.
    A dry run only warns about a data dir that is not prepared yet: the script does not
    depend on it, and it may be prepared before the job is submitted."""
    try:
        check_data_dir(job)
    except ConfigError as exc:
        if not dry_run or exc.key != "data.dir":
            raise
        print(f"paperscale: warning: {exc} (a real submit refuses this)", file=sys.stderr)
    if job.train.device == "cuda" and not profile.gpus_per_node:
        raise ConfigError("train.device", "cuda needs a profile with gpus_per_node >= 1")
    if job.train.precision == "fp16" and (not profile.gpus_per_node or job.train.device == "cpu"):
        raise ConfigError(
            "train.precision",
            "fp16 needs GPUs (DeepSpeed's CPU accelerator refuses it); use auto or fp32",
        )


def with_save_lead(job: JobConfig, profile: ClusterProfile) -> ClusterProfile:
    """The profile with a signal lead time that leaves room for the job's checkpoint save
    (launch/cost_model/save.py; bf16 weights on GPUs, fp32 on CPUs, 1 GB/s per node assumed)."""
    from launch.cost_model.save import save_plan, signal_lead_seconds
    from model.config import ModelConfig
    from model.params import count_parameters

    vocab = job.model.vocab_size or job.data.vocab_size
    n_params = count_parameters(ModelConfig(**{**job.model.__dict__, "vocab_size": vocab}))
    ranks = profile.ranks_per_node()
    precision = job.train.precision
    if precision == "auto":
        precision = "bf16" if profile.gpus_per_node else "fp32"
    save = save_plan(
        n_params["total"], job.train.zero_stage, profile.nodes * ranks, ranks, precision
    )
    lead = signal_lead_seconds(save.seconds, profile.signal_seconds)
    if lead != profile.signal_seconds:
        print(
            f"paperscale: signal lead time {lead} s (the profile's {profile.signal_seconds} s is "
            f"short of a ~{save.seconds:.0f} s save at {save.write_gbs:g} GB/s)",
            file=sys.stderr,
        )
    return dataclasses.replace(profile, signal_seconds=lead)


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The job id (and more) of the run's submission, read by `paperscale status`."""
    path = RunDir(run_dir).slurm_record
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def sbatch(script: Path) -> str:
    """Submit `script`; returns the job id."""
    proc = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.splitlines() if x.strip()] or [f"exit {proc.returncode}"]
        raise SubmitError(f"sbatch refused the job: {lines[-1].strip()}")
    return proc.stdout.strip().split(";")[0]


def profile_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster profile's fields given on the command line (None: the profile's value)."""
    return {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "procs_per_node": args.nproc_per_node,
        "time": args.time,
        "partition": args.partition,
        "account": args.account,
        "qos": args.qos,
        "constraint": args.constraint,
    }


def submit(args: argparse.Namespace) -> int:
    """`paperscale submit`: validate, write the run dir's script and config, sbatch it."""
    job = load_config(args.config, args.overrides)
    if args.run_dir:
        job.run.dir = args.run_dir
    profile = load_profile(args.cluster, profile_overrides(args))
    validate_job(job, profile, args.dry_run)
    profile = with_save_lead(job, profile)
    run_dir = job.run_dir().resolve()
    check_resume(job, run_dir)
    for name, value in (
        ("run.name", "_".join(job.run.name.split())),
        ("--run-dir", str(run_dir)),
        ("the working directory", str(Path.cwd())),
    ):
        if why := sbatch_value_problem(value):
            raise ConfigError(name, why)
    job.run.dir = str(run_dir)
    job.data.dir = str(Path(job.data.dir).resolve())
    script = batch_script(
        job.run.name, run_dir, profile, Path.cwd().resolve(), profile.python or sys.executable
    )
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    if shutil.which("sbatch") is None:
        raise SubmitError("sbatch not found: submit from a machine with Slurm's commands")
    previous = read_record(run_dir)
    if previous:
        state = job_state(str(previous["job_id"]))
        if state.get("state") in ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "COMPLETING"):
            raise SubmitError(
                f"{run_dir} already has job {previous['job_id']} ({state['state']}); "
                "scancel it or use another --run-dir"
            )
    run = RunDir(run_dir)
    run.logs.mkdir(parents=True, exist_ok=True)
    run.config.write_text(to_yaml(job))
    script_path = run.job_script
    script_path.write_text(script)
    job_id = sbatch(script_path)
    record = {
        "job_id": job_id,
        "cluster": profile.name,
        "nodes": profile.nodes,
        "procs_per_node": profile.ranks_per_node(),
        "script": str(script_path),
        "log": str(run.slurm_log(job_id)),
        "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    run.slurm_record.write_text(json.dumps(record, indent=1))
    print(json.dumps({"job_id": job_id, "run_dir": str(run_dir), "log": record["log"]}))
    return 0


# ------------------------------------------------------------------------------ job state


def _run(command: list[str]) -> str | None:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o` output: space-separated Key=Value pairs on one line."""
    out: dict[str, str] = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if sep:
            out[key] = value
    return out


def job_state(job_id: str) -> dict[str, Any]:
    """The scheduler's view of a job: state, restarts, exit code, reason, nodes.

    Asks `scontrol` (jobs slurmctld still holds), then `sacct` (finished jobs, where accounting
    runs); says "no scheduler" where neither command exists.
    """
    if not any(shutil.which(c) for c in ("scontrol", "squeue", "sacct")):
        return {"job_id": job_id, "scheduler": None, "state": "no scheduler"}
    shown = _run(["scontrol", "show", "job", "-o", job_id]) if shutil.which("scontrol") else None
    if shown and "JobState=" in shown:
        fields = parse_scontrol(shown.splitlines()[0])
        return {
            "job_id": job_id,
            "scheduler": "slurm",
            "state": fields.get("JobState"),
            "reason": fields.get("Reason"),
            "restarts": int(fields.get("Restarts", "0") or 0),
            "exit_code": fields.get("ExitCode"),
            "nodes": fields.get("NodeList"),
            "run_time": fields.get("RunTime"),
        }
    if shutil.which("squeue"):
        queued = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N|%M"])
        if queued and queued.strip():
            state, reason, nodes, run_time = (queued.strip().split("|") + [""] * 4)[:4]
            return {
                "job_id": job_id,
                "scheduler": "slurm",
                "state": state,
                "reason": reason,
                "nodes": nodes,
                "run_time": run_time,
            }
    if shutil.which("sacct"):
        acct = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode,NodeList"])
        if acct and acct.strip():
            state, exit_code, nodes = (acct.strip().splitlines()[-1].split("|") + [""] * 3)[:3]
            return {
                "job_id": job_id,
                "scheduler": "slurm",
                "state": state.split()[0] if state else None,
                "exit_code": exit_code,
                "nodes": nodes,
            }
    return {"job_id": job_id, "scheduler": "slurm", "state": "unknown (no longer listed)"}
