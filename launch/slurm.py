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
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from launch.cluster import ClusterProfile, load_profile, sbatch_value_problem, secret_assignment
from launch.config import ConfigError, JobConfig, check_data_dir, load_config, to_yaml
from launch.preflight import check_resume
from trainer.run_dir import RunDir

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class SubmitError(Exception):
    """Slurm refused or could not be reached; `str()` is one line for the user."""


def sbatch_directives(
    job_name: str, run: RunDir, profile: ClusterProfile, workdir: Path
) -> list[str]:
    """The #SBATCH arguments: resources from the profile, the log appended to across requeues,
    requeue on, and USR1 to the batch shell `signal_seconds` before the time limit."""
    args = [
        f"--job-name={'_'.join(job_name.split())}",
        f"--nodes={profile.nodes}",
        "--ntasks-per-node=1",
    ]
    if profile.cpus_per_task:
        args.append(f"--cpus-per-task={profile.cpus_per_task}")
    if profile.gpus_per_node:
        args.append(f"--gpus-per-node={profile.gpus_per_node}")
    if profile.mem:
        args.append(f"--mem={profile.mem}")
    args.append(f"--time={profile.time}")
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(profile, key)
        if value:
            args.append(f"--{key}={value}")
    return [
        *args,
        f"--output={run.slurm_log('%j')}",
        "--open-mode=append",
        "--requeue",
        f"--signal=B:USR1@{profile.signal_seconds}",
        f"--chdir={workdir}",
        *profile.sbatch_args,
    ]


def node_tasks_line(run: RunDir, profile: ClusterProfile, step: list[str]) -> str:
    """srun: one task per node, each `launch.slurm_job node` (torchrun with its ranks)."""
    q = shlex.quote
    srun = ["srun", f"--nodes={profile.nodes}", f"--ntasks={profile.nodes}"]
    srun += ["--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if profile.cpus_per_task:
        srun.append(f"--cpus-per-task={profile.cpus_per_task}")
    node = [*map(q, step), "node", "--run-dir", q(str(run.root)), f"--nnodes={profile.nodes}"]
    node += [f"--nproc-per-node={profile.ranks_per_node()}", '--try="$tries"']
    return " ".join([*srun, *node]) + " &"


def batch_script(
    job_name: str, run_dir: Path, profile: ClusterProfile, workdir: Path, python: str
) -> str:
    """The sbatch script of one run. It holds no secrets: only the profile's environment
    (checked by `ClusterProfile.problems`) and paths; credentials come from the environment of
    the submitting shell, which sbatch passes on."""
    q = shlex.quote
    run = RunDir(run_dir)
    step = [python, "-m", "launch.slurm_job"]
    on_run = ["--run-dir", q(str(run_dir))]
    port = [*map(q, step), "port", '--try="$tries"']
    if profile.rendezvous_port:
        port.append(f"--fixed={profile.rendezvous_port}")
    lines = [
        "#!/bin/bash",
        f"# Written by `paperscale submit` (cluster profile {profile.name!r}) for the run in",
        f"# {run_dir}. Submit again with: sbatch {q(str(run.job_script))}",
        *(f"#SBATCH {arg}" for arg in sbatch_directives(job_name, run, profile, workdir)),
        "",
        "set -o pipefail",
        "",
        "# environment from the cluster profile",
        *(f"export {name}={q(str(value))}" for name, value in profile.env.items()),
        f"export PYTHONPATH={q(str(PROJECT_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export PYTHONUNBUFFERED=1",
        *profile.setup,
        "",
        *SCRIPT_SIGNALS,
        "",
        "# A bad config fails the job here, at once, with exit code 2 (and no requeue).",
        " ".join([*map(q, step), "check", *on_run]) + " || exit $?",
        f"rm -f {q(str(run.summary))}",
        "",
        *SCRIPT_RENDEZVOUS,
        '    MASTER_PORT="$(' + " ".join(port) + ')" || exit $?',
        "    export MASTER_PORT",
        "    # one task per node: torchrun with --nproc_per_node ranks",
        "    " + node_tasks_line(run, profile, step),
        *SCRIPT_WAIT,
        "    "
        + " ".join([*map(q, step), "startup-failed", *on_run, '--try="$tries"'])
        + " || break",
        "done",
        "",
        *SCRIPT_OUTCOME,
        "    " + " ".join([*map(q, step), "outcome", *on_run]),
        *SCRIPT_REQUEUE,
        *requeue_on_failure(profile.max_requeues),
        'exit "$rc"',
        "",
    ]
    script = "\n".join(lines)
    bad = [line for line in script.splitlines() if secret_assignment(line)]
    if bad:  # the profile's checks make this unreachable; a script is never written with one
        raise ConfigError("cluster", f"refusing to write a secret into the script: {bad[0]!r}")
    return script


SCRIPT_SIGNALS = [
    "# c10d rendezvous of torchrun on the first node of the allocation, where this shell runs",
    'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
    "export MASTER_ADDR",
    "",
    "# USR1 (Slurm's warning before the time limit, or `scancel --signal=USR1 --batch`)",
    "# goes on to the tasks: every rank finishes its step, saves and exits, and the job is",
    "# requeued. TERM (scancel) ends the job without a requeue.",
    "step=",
    "requeue=1",
    "stopping=0",
    'trap \'stopping=1; [ -n "$step" ] && kill -USR1 "$step" 2>/dev/null\' USR1',
    'trap \'requeue=0; stopping=1; [ -n "$step" ] && kill -TERM "$step" 2>/dev/null\' TERM',
]
SCRIPT_RENDEZVOUS = [
    "# Each try rendezvouses on a port that is free on this node when it starts (never one",
    "# derived from the job id: a requeued attempt, another job or another program may hold",
    "# that); a try that fails before any rank started is tried again on a new port.",
    "tries=0",
    "while :; do",
    "    tries=$((tries + 1))",
]
SCRIPT_WAIT = [
    "    step=$!",
    '    while kill -0 "$step" 2>/dev/null; do wait "$step"; done',
    '    wait "$step"; rc=$?',
    "    step=",
    '    [ "$rc" -ne 0 ] && [ "$stopping" -eq 0 ] || break',
]
SCRIPT_OUTCOME = [
    "# torchrun's workers exit 0; the run's summary.json has its exit code: 75 when the",
    "# ranks saved a checkpoint and stopped on a signal. Then, unless the job is being",
    "# cancelled, requeue it; the requeued job resumes from that checkpoint.",
    'if [ "$rc" -eq 0 ]; then',
]
SCRIPT_REQUEUE = [
    "    rc=$?",
    "fi",
    'if [ "$rc" -eq 75 ] && [ "$requeue" -eq 1 ]; then',
    '    echo "paperscale: checkpoint saved; requeueing job $SLURM_JOB_ID"',
    '    scontrol requeue "$SLURM_JOB_ID"',
]


def requeue_on_failure(max_requeues: int) -> list[str]:
    """The script's answer to a step that failed without an exit code of the run's own (2 a
    bad config, 65 a non-finite loss, 70 a crash loop, 74 a failed save, 75 saved and
    stopped): a node lost, torchrun's restarts used up, a rendezvous that kept failing. The
    job is requeued while Slurm's restart count is below `max_requeues`; the next attempt
    resumes from the latest complete checkpoint, and a crash loop stops itself (70)."""
    return [
        'elif [ "$requeue" -eq 1 ] && [ "$rc" -ne 0 ] && ! case "$rc" in 2|65|70|74) true;; '
        "*) false;; esac; then",
        f'    if [ "${{SLURM_RESTART_COUNT:-0}}" -lt {max_requeues} ]; then',
        "        echo \"paperscale: the job's step failed (exit $rc); requeueing job "
        f'$SLURM_JOB_ID (requeue $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) of {max_requeues})"',
        '        scontrol requeue "$SLURM_JOB_ID"',
        "    else",
        "        echo \"paperscale: the job's step failed (exit $rc) and the job was requeued "
        f'{max_requeues} times (cluster profile max_requeues); not again"',
        "    fi",
        "fi",
    ]


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
    (launch/plan_save.py; bf16 weights on GPUs, fp32 on CPUs, 1 GB/s per node assumed)."""
    from launch.plan_save import save_plan, signal_lead_seconds
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
