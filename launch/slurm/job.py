"""The steps of a Slurm job written by `paperscale submit`, run inside the allocation.

`check` (batch shell, first node): loads and validates the run's config like `train` does and
exits 2 with one line in the job's log on a bad one, so that the job fails at once.

`node` (one srun task per node): starts torchrun with a c10d rendezvous on the first node of
the allocation, whose workers run `paperscale train`. SIGUSR1 and SIGTERM go on to the workers
(torchrun itself would die on USR1), which finish their step, save and exit.

`port` and `startup-failed` (batch shell): the rendezvous port of each try, and whether a try
failed before any rank started, so that it is tried again on a new port
(launch/slurm/rendezvous.py); a try where a node never joined (its task never reached
torchrun within train.dist_timeout_s) is not tried again: the step fails naming the node, and
the job's ending requeues it while the profile's max_requeues allows.

`outcome` (batch shell, after the tasks ended): exits with the run's exit code as its
summary.json tells it (torchrun's workers themselves exit 0): 75 when the ranks saved a
checkpoint and stopped on a signal, whereupon the batch shell requeues the job; the code of a
run that stopped on an error; 0 when it finished.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from launch.local import train_args
from trainer.run_dir import RunDir

RESEND_EVERY_S = 2.0


def slurm_context() -> dict[str, str]:
    """The job's identity as Slurm sets it (empty strings outside a job)."""
    return {
        "job_id": os.environ.get("SLURM_JOB_ID", ""),
        "restart": os.environ.get("SLURM_RESTART_COUNT", "0"),
        "nodes": os.environ.get("SLURM_JOB_NODELIST", ""),
        "node_id": os.environ.get("SLURM_NODEID", "0"),
    }


def job_nodes(nodelist: str) -> list[str]:
    """The job's node names in order (Slurm's compressed list expanded by scontrol)."""
    proc = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scontrol show hostnames {nodelist}: {proc.stderr.strip()}")
    return proc.stdout.split()


def check(run_dir: Path) -> int:
    from launch.config import ConfigError, check_data_dir, load_config
    from launch.preflight import check_resume

    ctx = slurm_context()
    print(
        f"paperscale: slurm job {ctx['job_id']} (restart {ctx['restart']}) on {ctx['nodes']}: "
        f"run dir {run_dir}",
        flush=True,
    )
    try:
        job = load_config(RunDir(run_dir).config, [f"run.dir={run_dir}"])
        check_data_dir(job)
        from trainer.run_lock import RunLock, RunLocked

        try:  # taken for the check only: node 0's task takes it for the run
            lock = RunLock(run_dir).acquire()
        except RunLocked as exc:
            raise ConfigError("--run-dir", str(exc)) from None
        try:
            check_resume(job, run_dir)
        finally:
            lock.release()
        from launch.agent import rank_start
        from launch.local import use_cuda

        cuda = use_cuda(job.train.device)
        if job.train.precision == "fp16" and not cuda:
            raise ConfigError("train.precision", "fp16 needs a GPU; this node has none")
        rank_start(cuda)
    except ConfigError as exc:
        print(f"paperscale: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


def torchrun_command(
    python: str,
    run_dir: Path,
    nnodes: int,
    nproc_per_node: int,
    endpoint: str,
    rdzv_id: str,
    is_host: bool,
    grace_s: float = 30.0,
    max_restarts: int = 0,
    numa_binding: str | None = None,
    join_timeout_s: float = 600.0,
    start: str = "exec",
) -> list[str]:
    """torchrun for one node of a multi-node job. The first node hosts the rendezvous store
    (`is_host` is given, not guessed from host names, which may differ from the node list's).
    On TERM torchrun gives its ranks `grace_s` (train.stop_grace_s) to save before killing.
    `numa_binding`: the profile's mode of torchrun's --numa-binding (None: unbound).
    `join_timeout_s` (train.dist_timeout_s): how long the rendezvous waits for every node
    before it fails (torchrun's own default is 600 s). `start`: how ranks start
    (launch/agent.py)."""
    from launch.agent import torchrun_program

    return [
        *torchrun_program(start, python),
        f"--nnodes={nnodes}",
        f"--nproc_per_node={nproc_per_node}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint}",
        f"--rdzv_id={rdzv_id}",
        f"--rdzv_conf=is_host={int(is_host)},join_timeout={math.ceil(join_timeout_s)}",
        *([f"--numa-binding={numa_binding}"] if numa_binding else []),
        *train_args(RunDir(run_dir).config, run_dir, grace_s, max_restarts, start),
    ]


def record_stop_signals() -> list[int]:
    """From now on SIGUSR1 and SIGTERM are only recorded (in the returned list), SIGINT is
    ignored: done first thing in the node task, so that no signal kills it while it starts."""
    received: list[int] = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: received.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return received


@dataclass
class TorchrunResult:
    """How torchrun ended: its exit code, whether it ever started a rank, and the last lines
    it (or a rank) wrote to stderr."""

    returncode: int
    ranks_started: bool
    stderr_tail: list[str]


def run_torchrun_resending(
    command: list[str], env: dict[str, str], received: list[int], keep_fds: tuple[int, ...] = ()
) -> TorchrunResult:
    """Run torchrun; each signal in `received` (see `record_stop_signals`) goes to the workers,
    again every RESEND_EVERY_S seconds until torchrun exits. Its stderr passes through to ours
    (the job's log), its last lines kept for saying why a start failed.

    Slurm delivers a step's signals to every process of the step, torchrun included, which
    USR1 would kill and TERM would make kill its workers: torchrun is started with USR1, TERM
    and INT ignored (kept across exec, inherited by its workers) and handles only HUP and QUIT.
    A worker ignores them until it installs its own handler, first thing in `train`
    (trainer/signals.py), so a signal that came during start-up is sent again; one more to a
    worker that is already stopping changes nothing.
    """
    from launch.local import ignore_stop_signals, rank_pids

    proc = subprocess.Popen(
        command,
        env=env,
        preexec_fn=ignore_stop_signals,
        stderr=subprocess.PIPE,
        pass_fds=keep_fds,
    )
    tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
    copier = threading.Thread(target=copy_stderr, args=(proc, tail), daemon=True)
    copier.start()
    sent_at, started = 0.0, False
    while proc.poll() is None:
        workers = rank_pids(proc.pid)
        started = started or bool(workers)
        if received and time.monotonic() - sent_at >= RESEND_EVERY_S:
            sent_at = time.monotonic()
            for pid in workers:
                for sig in sorted(set(received)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
        time.sleep(0.1)
    copier.join(timeout=5)
    return TorchrunResult(proc.returncode, started, list(tail))


STDERR_TAIL_LINES = 200


def copy_stderr(proc: subprocess.Popen, tail: deque[str]) -> None:
    """torchrun's stderr to ours, line by line, keeping the last lines in `tail`."""
    assert proc.stderr is not None
    out = sys.stderr.buffer
    for line in iter(proc.stderr.readline, b""):
        out.write(line)
        out.flush()
        tail.append(line.decode("utf-8", "replace").rstrip("\n"))


def node(
    run_dir: Path, nnodes: int, nproc_per_node: int, attempt_try: int, received: list[int],
    numa_binding: str | None = None,
) -> int:  # fmt: skip
    from launch.agent import STARTS, rank_start
    from launch.config import load_config
    from launch.local import child_env, use_cuda
    from launch.slurm.rendezvous import arrive, first_error, record_startup_failure

    ctx = slurm_context()
    run = RunDir(run_dir)
    job = load_config(run.config, [f"run.dir={run_dir}"])
    endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    start = rank_start(cuda := use_cuda(job.train.device))  # (checked by `check`)
    command = torchrun_command(
        sys.executable, run_dir, nnodes, nproc_per_node, endpoint,
        rdzv_id=f"{ctx['job_id']}-{ctx['restart']}-{attempt_try}", is_host=ctx["node_id"] == "0",
        grace_s=job.train.stop_grace_s, max_restarts=job.train.max_restarts,
        numa_binding=numa_binding, join_timeout_s=job.train.dist_timeout_s, start=start,
    )  # fmt: skip
    print(
        f"paperscale: node {socket.gethostname()} (node {ctx['node_id']} of {nnodes}): "
        f"torchrun with {nproc_per_node} ranks ({STARTS[start]}), rendezvous at {endpoint}",
        flush=True,
    )
    env = child_env(cuda)
    if nnodes > 1:
        from launch.slurm.network import NetworkError, set_interface

        this_node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        try:
            line = set_interface(env, job_nodes(ctx["nodes"]), this_node)
        except (NetworkError, RuntimeError, OSError) as exc:  # OSError: no scontrol here
            print(f"paperscale: error: node {this_node}: {exc}", file=sys.stderr, flush=True)
            return 2
        print(f"paperscale: node {this_node}: {line}", flush=True)
    if not arrive(run, ctx, attempt_try, received):
        return 1
    lock = None
    if ctx["node_id"] == "0":  # the first node's task holds the run dir for the whole step
        from trainer.run_lock import HOLDER_ENV, RunLock, RunLocked

        try:
            lock = RunLock(run.root).acquire()
        except RunLocked as exc:
            print(f"paperscale: error: {exc}", file=sys.stderr, flush=True)
            return 2
        env[HOLDER_ENV] = str(lock.path)
    keep = (lock.fd,) if lock else ()
    try:
        result = run_torchrun_resending(command, env, received, keep)
    finally:
        if lock:
            lock.release()
    if result.returncode != 0 and not result.ranks_started:
        reason = first_error(result.stderr_tail) or f"torchrun exited {result.returncode}"
        record_startup_failure(
            run, ctx["job_id"], ctx["restart"], attempt_try, ctx["node_id"], reason
        )
    return result.returncode


def port(attempt_try: int, fixed_port: int) -> int:
    from launch.slurm.rendezvous import port_for_try

    print(port_for_try(attempt_try, fixed_port), flush=True)
    return 0


def startup_failed(run_dir: Path, attempt_try: int) -> int:
    """Exit 0 (try again) when try `attempt_try` failed before any rank started and tries are
    left; else 1. Says which in one line when the start failed."""
    from launch.config import load_config
    from launch.slurm.rendezvous import TRIES, absent_nodes, startup_failure_line

    ctx = slurm_context()
    run = RunDir(run_dir)
    endpoint = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    multinode = int(os.environ.get("SLURM_JOB_NUM_NODES") or 1) > 1  # else node 0 hosts alone
    absent = absent_nodes(run, ctx, attempt_try, job_nodes(ctx["nodes"])) if multinode else []
    if absent:  # a node that never came would not come on a new port either: no more tries
        timeout = load_config(run.config, [f"run.dir={run_dir}"]).train.dist_timeout_s
        print(
            f"paperscale: error: node {', '.join(absent)} never joined the rendezvous at "
            f"{endpoint} within {timeout:g} s (train.dist_timeout_s); the step fails",
            file=sys.stderr, flush=True,
        )  # fmt: skip
        return 1
    retry = attempt_try < TRIES
    line = startup_failure_line(run, ctx["job_id"], ctx["restart"], attempt_try, endpoint, retry)
    if line is None:
        return 1
    print(line, file=sys.stderr, flush=True)
    return 0 if retry else 1


def outcome(run_dir: Path) -> int:
    from launch.cmd_train import preempted_exit_code

    return preempted_exit_code(run_dir)


def main(argv: list[str] | None = None) -> int:
    received = record_stop_signals() if "node" in (argv or sys.argv)[:2] else []
    p = argparse.ArgumentParser(prog="python -m launch.slurm.job")
    sub = p.add_subparsers(dest="step", required=True)
    c = sub.add_parser("check", help="validate the run's config (batch shell)")
    c.add_argument("--run-dir", required=True)
    n = sub.add_parser("node", help="torchrun on this node (one srun task per node)")
    n.add_argument("--run-dir", required=True)
    n.add_argument("--nnodes", type=int, required=True)
    n.add_argument("--nproc-per-node", type=int, required=True)
    n.add_argument("--try", dest="attempt_try", type=int, default=1)
    n.add_argument("--numa-binding", default=None, help="the profile's numa_binding")
    s = sub.add_parser("outcome", help="exit with the code summary.json gives (75: requeue)")
    s.add_argument("--run-dir", required=True)
    o = sub.add_parser("port", help="the rendezvous port of a try (batch shell, first node)")
    o.add_argument("--try", dest="attempt_try", type=int, required=True)
    o.add_argument("--fixed", type=int, default=0, help="the profile's rendezvous_port")
    f = sub.add_parser("startup-failed", help="exit 0 when a try failed to start: try again")
    f.add_argument("--run-dir", required=True)
    f.add_argument("--try", dest="attempt_try", type=int, required=True)
    args = p.parse_args(argv)
    if args.step == "port":
        return port(args.attempt_try, args.fixed)
    run_dir = Path(args.run_dir)
    if args.step == "check":
        return check(run_dir)
    if args.step == "outcome":
        return outcome(run_dir)
    if args.step == "startup-failed":
        return startup_failed(run_dir, args.attempt_try)
    return node(run_dir, args.nnodes, args.nproc_per_node, args.attempt_try, received,
                args.numa_binding)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
