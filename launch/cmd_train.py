"""`paperscale train` (local: this process or torchrun) and `paperscale submit` (Slurm)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

from data_pipeline.manifest import tokenizer_path
from launch.config import ConfigError, JobConfig
from launch.usage import UsageError, die
from trainer.run_dir import RunDir


def load_train_job(args: argparse.Namespace) -> JobConfig:
    """The job as `train` runs it; every problem is a ConfigError before anything starts
    (what the run dir holds is checked once its lock is taken)."""
    from launch.config import check_data_dir, load_config
    from launch.local import use_cuda

    job = load_config(args.config, args.overrides)
    if args.run_dir:
        job.run.dir = args.run_dir
    if args.nproc < 1:
        raise ConfigError("--nproc", f"must be >= 1, got {args.nproc}")
    check_data_dir(job)
    if job.train.device == "cuda" and not use_cuda("auto"):
        raise ConfigError(
            "train.device", "cuda, but torch sees no CUDA device on this machine; use auto or cpu"
        )
    if job.train.precision == "fp16" and not use_cuda(job.train.device):
        raise ConfigError(
            "train.precision",
            "fp16 needs a GPU (DeepSpeed's CPU accelerator refuses it); use auto or fp32",
        )
    job.run.dir = str(job.run_dir().resolve())
    from launch.agent import rank_start

    rank_start(use_cuda(job.train.device))  # a bad PAPERSCALE_RANK_START: one line, exit 2
    return job


def take_run_lock(run: RunDir, is_main: bool) -> Any:
    """The run dir's lock (trainer/run_lock.py), taken by the process that starts the run:
    this launcher, or rank 0 of a torchrun started by hand; None where a parent holds it (its
    children see HOLDER_ENV). A second writer is one line and exit 2."""
    from trainer.run_lock import HOLDER_ENV, RunLock, RunLocked

    lock = RunLock(run.root)
    if not is_main or lock.held_for_me():
        return None
    try:
        lock.acquire()
    except RunLocked as exc:
        raise UsageError(str(exc)) from None
    os.environ[HOLDER_ENV] = str(lock.path)  # for the ranks torchrun starts
    return lock


def cmd_train(args: argparse.Namespace) -> int:
    job = load_train_job(args)
    run = RunDir(Path(job.run.dir))
    is_main = os.environ.get("RANK", "0") == "0"
    lock = take_run_lock(run, is_main)
    try:
        return train_locked(args, job, run, is_main, lock)
    finally:
        if lock:
            from trainer.run_lock import HOLDER_ENV

            lock.release()
            os.environ.pop(HOLDER_ENV, None)  # a process that goes on holds nothing


def train_locked(
    args: argparse.Namespace, job: JobConfig, run: RunDir, is_main: bool, lock: Any
) -> int:
    """`train` once the run dir is this process's (or its launcher's)."""
    from launch.agent import rank_start
    from launch.config import to_dict, to_yaml
    from launch.local import inside_torchrun, run_torchrun, use_cuda
    from trainer.run_dir import write_atomic

    if not inside_torchrun():
        from launch.preflight import check_resume

        # Under the lock: another writer's save or pruning cannot change what it reads.
        check_resume(job, run.root)
    if is_main:
        run.root.mkdir(parents=True, exist_ok=True)
        write_atomic(run.config, to_yaml(job))
        shutil.copyfile(tokenizer_path(Path(job.data.dir)), run.tokenizer)
    if not inside_torchrun() and args.nproc > 1:
        run.summary.unlink(missing_ok=True)
        cuda = use_cuda(job.train.device)
        code = run_torchrun(
            args.nproc,
            run.config,
            run.root,
            cuda,
            job.train.stop_grace_s,
            keep_fds=(lock.fd,) if lock else (),
            max_restarts=job.train.max_restarts,
            start=rank_start(cuda),
        )
        if code != 0:
            from trainer.attempts import report_watchdogs

            report_watchdogs(run)  # the last attempt's stuck ranks (earlier ones: by the next)
        # After a TERM torchrun exits non-zero even when its ranks saved and exited cleanly:
        # the ranks' summary.json, when written, tells how the run ended.
        summary = run.read_summary()
        return code if summary is None else exit_code_of(summary)

    from trainer.loop import PrecisionError, train

    try:
        summary = train(job, run.root, to_dict(job))
    except PrecisionError as exc:
        raise ConfigError("train.precision", str(exc)) from None
    if is_main:
        write_atomic(run.summary, json.dumps(summary, indent=1))
        print("summary: " + json.dumps(summary), flush=True)
    # Under torchrun a worker's non-zero exit makes torchrun kill the other workers, maybe
    # before they finished saving: workers exit 0 and the launcher reads summary.json.
    return 0 if inside_torchrun() else exit_code_of(summary)


def exit_code_of(summary: dict[str, Any] | None) -> int:
    """The code of a run that stopped on an error (non-finite loss, a checkpoint that could
    not be written), EXIT_PREEMPTED when it stopped on a signal after saving, else 0."""
    from trainer.signals import EXIT_PREEMPTED

    if not summary:
        return 0
    if summary.get("exit_code"):
        return int(summary["exit_code"])
    return EXIT_PREEMPTED if summary.get("preempted") else 0


def preempted_exit_code(run_dir: Path) -> int:
    """The exit code summary.json gives the workers' run (they themselves exit 0), so that
    scripts and schedulers can tell a finished, a preempted and a failed run apart."""
    return exit_code_of(RunDir(run_dir).read_summary())


def cmd_submit(args: argparse.Namespace) -> int:
    from launch.slurm.submit import SubmitError, submit

    try:
        return submit(args)
    except SubmitError as exc:
        return die(str(exc))
