"""The sbatch script of a run, as `paperscale submit` writes it (launch/slurm/submit.py submits it).

#SBATCH lines from the cluster profile; the environment and setup lines of the profile; the
signal traps (USR1 -> save and requeue, TERM -> save and end); the config check; the tries of
the c10d rendezvous on a free port; one srun task per node (launch/slurm/job.py `node`); and the
job's ending: requeue after a saved stop, or after a step that failed without a code of the
run's own while the requeue budget lasts.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from launch.config import ConfigError
from launch.slurm.cluster import ClusterProfile, secret_assignment
from trainer.run_dir import RunDir

PROJECT_ROOT = Path(__file__).resolve().parents[2]


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
    """srun: one task per node, each `launch.slurm.job node` (torchrun with its ranks)."""
    q = shlex.quote
    srun = ["srun", f"--nodes={profile.nodes}", f"--ntasks={profile.nodes}"]
    srun += ["--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if profile.cpus_per_task:
        srun.append(f"--cpus-per-task={profile.cpus_per_task}")
    node = [*map(q, step), "node", "--run-dir", q(str(run.root)), f"--nnodes={profile.nodes}"]
    node += [f"--nproc-per-node={profile.ranks_per_node()}", '--try="$tries"']
    node += [f"--numa-binding={profile.numa_binding}"] if profile.numa_binding else []
    return " ".join([*srun, *node]) + " &"


def batch_script(
    job_name: str, run_dir: Path, profile: ClusterProfile, workdir: Path, python: str
) -> str:
    """The sbatch script of one run. It holds no secrets: only the profile's environment
    (checked by `ClusterProfile.problems`) and paths; credentials come from the environment of
    the submitting shell, which sbatch passes on."""
    q = shlex.quote
    run = RunDir(run_dir)
    step = [python, "-m", "launch.slurm.job"]
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
