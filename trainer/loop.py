"""The training job: `train()` reads like the algorithm, `Trainer` holds one rank's parts.

settle (precision, world size) -> build (engine, data, state, checkpoints, sinks)
-> restore -> loop {step, maybe log, maybe evaluate, maybe save, maybe stop} -> finish
"""

from __future__ import annotations

import gc
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from data_pipeline.loader import Batch, TokenBatchStream
from data_pipeline.manifest import tokenizer_path
from data_pipeline.worker_server import start_early
from trainer import attempts
from trainer.budget import Budget
from trainer.checkpoint.disk import CheckpointError
from trainer.checkpoint.manager import CheckpointManager, export_source
from trainer.checkpoint.safe_load import forbid_code_in_checkpoints
from trainer.config import watchdog_timeout_s
from trainer.dist import DistEnv, broadcast_str, init_distributed
from trainer.ds.config import ask_grad_norm, step_guards_update
from trainer.ds.engine import build_engine, make_deterministic, seed_everything
from trainer.events import LoopEvents
from trainer.export import export_checkpoint
from trainer.faults import Faults
from trainer.metrics import MetricsLogger, Throughput, memory_metrics, stderr_warn
from trainer.profiler import StepProfiler
from trainer.report import write_report_or_warn
from trainer.run_dir import RunDir, tag_for
from trainer.settle import PrecisionError, SettledJob, cluster_peak_flops, settle_job
from trainer.signals import (
    EXIT_NONFINITE,
    EXIT_SAVE_FAILED,
    LoopGuard,
    MidStepStop,
    StopRequest,
    Watchdog,
)
from trainer.sinks import open_sinks
from trainer.startup import DONE, start_trace
from trainer.state import DataPosition, RngState, TrainState, rng_preserved
from trainer.step import (
    LogWindow,
    LoopFlags,
    batch_flops,
    loss_finite_everywhere,
    nonfinite_flag,
    optimizer_metrics,
    skipped_counts,
    take_batches,
    train_step,
)
from trainer.target import Target
from trainer.validation import Evaluator

__all__ = ["PrecisionError", "train"]

EXIT_MARGIN_S = 5.0  # of train.stop_grace_s, kept for leaving after the save


def train(job: Any, run_dir: Path, resolved: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume) the job in this process; every rank calls this. Returns the summary.
    Each call is one attempt of the run (trainer/attempts.py): a crash loop stops here."""
    stop_request = StopRequest().install()  # first: a stop signal during start-up counts too
    run = RunDir(run_dir)
    trace = start_trace(run.logs)  # at "start": whom a collective of the start-up waits for
    start_early(job.data.num_workers)  # the loader's fork server, while this is one thread
    if job.train.deterministic:
        make_deterministic()  # before any CUDA work
    trainer: Trainer | None = None
    env: DistEnv | None = None
    try:
        trace.enter("process group")
        env = init_distributed(job.train.device, job.train.dist_timeout_s)
        forbid_code_in_checkpoints()
        trace.enter("agree")
        refusal = attempts.agree_on_start(run, job.train.crash_loop_attempts, env)
        if refusal is not None:
            stop_request.uninstall()
            return refusal
        trace.enter("settle")
        settled = settle_job(job, run, resolved, env)
        trace.enter("build")
        trainer = Trainer(settled, run, env, stop_request)
        trace.enter("restore")
        trainer.restore_and_open()
        trace.enter("first step")
        with trainer.guarded():
            while not trainer.done():
                trainer.step()
                trace.enter(DONE)
                trainer.maybe_log()
                trainer.maybe_evaluate()
                trainer.maybe_save()
        summary = trainer.finish()
    except BaseException as exc:
        trace.fail(job.train.dist_timeout_s, exc)
        if env is not None:
            attempts.record_failure(run, env, trainer.state.step + 1 if trainer else None, exc)
        raise
    if env.is_main:
        end = {"event": "end", "exit_code": summary.get("exit_code", 0)}
        attempts.append_event(run.attempts, end)
    return summary


class Trainer:
    """One rank's engine, data stream, training state, checkpoints and metrics, and the loop's
    bookkeeping between steps (log window, stop and failure state)."""

    def __init__(
        self, settled: SettledJob, run: RunDir, env: DistEnv, stop_request: StopRequest
    ) -> None:
        self.stop_request = stop_request
        self.job, self.cfg, self.run, self.env = settled.job, settled.job.train, run, env
        self.settled = settled
        self.model_cfg = settled.model_cfg
        self.state = TrainState(wandb_id=uuid.uuid4().hex[:12])
        self.budget = Budget(self.cfg, self.job.optim.warmup_steps, self.state, env)
        self.target = Target.of(self.cfg, self.state)  # train.target_bleu / target_nll
        seed_everything(self.cfg.seed)  # identical initial weights on every rank
        self.engine = build_engine(
            self.job, self.model_cfg, env, settled.universal,
            horizon=self.budget.horizon_for(self.job.optim.schedule),
        )  # fmt: skip
        seed_everything(self.cfg.seed * 1000 + env.rank)  # per-rank dropout streams
        faults = Faults.from_env(env.rank)  # the fault tests' seam: idle unless asked for
        faults.install(self.engine.module)
        self.data_dir = Path(self.job.data.dir)
        self.stream = TokenBatchStream(
            self.data_dir, "train", self.job.data, rank=env.rank, world_size=env.world_size,
            pin_memory=env.device.type == "cuda",  # so .to(non_blocking=True) overlaps
        )  # fmt: skip
        # host-side flags between micro-batches: gloo beside NCCL, so they never wait on a GPU
        self.control_group = (
            torch.distributed.new_group(backend="gloo") if env.device.type == "cuda" else None
        )
        self.mid_step = MidStepStop(stop_request, self.cfg.stop_grace_s, EXIT_MARGIN_S,
                                    self.control_group)  # fmt: skip
        self.checkpoints = CheckpointManager(
            run.checkpoints, self.engine, env.rank, env.world_size, self.state,
            {"data": DataPosition(self.stream), "rng": RngState()},
            keep_last=self.cfg.keep_last,
            meta={"model": self.model_cfg.__dict__, "config": settled.resolved},
            precision=self.cfg.precision, check_space=not faults.skip_space_check,
            observers=[faults], host_group=self.control_group,
        )  # fmt: skip
        self.evaluator = Evaluator(self.engine, self.job, settled.tokenizer, env)
        self.profiler = StepProfiler(self.job, settled.precision.precision, run, env)
        self.events = LoopEvents([self.profiler, faults])
        self.timer = Throughput()
        self.window = LogWindow(env.device)
        self.record: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.first_loss: float | None = None
        self.stopping, self.save_due = False, False
        self.failure: tuple[int, str] | None = None  # (exit code, one-line reason)
        self.nonfinite_streak = 0  # consecutive steps whose loss was not finite on some rank
        self.step_sums: torch.Tensor | None = None
        self.started = time.perf_counter()
        self.last_save = time.monotonic()
        # what restore_and_open() and guarded() set, before the first step
        self.resumed_at: int | None = None  # the step of the checkpoint restored
        self.start_step = 0  # the step this process started at
        self.logger = MetricsLogger([])  # the sinks (rank 0's)
        self.peak = 0.0  # the ranks' matmul peak FLOP/s (0: unknown, no MFU)
        self.batches: Iterator[Batch] = iter(())  # the stream, opened
        self.watchdog = Watchdog(self.cfg.dist_timeout_s, None)  # armed with the stacks' path

    # -- setup ----------------------------------------------------------------------------

    def restore_and_open(self) -> None:
        """Restore the latest checkpoint (engine, train state, data position, RNG), then open
        the sinks and measure the peak without moving the restored random streams."""
        if self.settled.tag is not None:
            self.checkpoints.restore(self.settled.tag)
            self.resumed_at = self.state.step
        self.state.wandb_id = broadcast_str(self.state.wandb_id)
        self.start_step = self.state.step
        self.budget.start(self.start_step)
        with rng_preserved():
            sinks = (
                open_sinks(self.job, self.run, self.state, self.resumed_at, self.settled.resolved)
                if self.env.is_main
                else []
            )
            self.logger = MetricsLogger(sinks)
            self.peak = cluster_peak_flops(
                self.env, self.cfg.precision, self.model_cfg, self.job.data.max_tokens
            )
        if self.env.is_main:
            attempts.announce_attempt(self.cfg.max_restarts)
        if self.env.is_main and self.resumed_at is not None:
            where = self.run.checkpoints.tag_dir(self.settled.tag or "")
            print(f"resumed from {where} at step {self.resumed_at}", flush=True)
        self.batches = iter(self.stream)
        # all built so far lives for the run: not scanned at each collection (seconds at exit)
        gc.freeze()

    def guarded(self) -> LoopGuard:
        """The loop's signal handler (a stop request finishes the step and saves) and the
        watchdog (a phase past train.dist_timeout_s ends the process; compiling: 1 h at least)."""
        stacks = self.run.watchdog_stacks(attempts.attempt_key(), self.env.rank)
        self.watchdog = Watchdog(watchdog_timeout_s(self.cfg), stacks)
        return LoopGuard(self.stop_request, self.watchdog)

    # -- the loop -------------------------------------------------------------------------

    def done(self) -> bool:
        ended = self.state.step >= self.budget.end_step() or self.budget.spent
        return ended or self.target.reached or self.stopping or self.failure is not None

    def step(self) -> None:
        """One optimizer step; a stop request, a save due by the clock and the previous step's
        non-finite loss travel in the step's one collective, so all ranks see them together.
        A step that a stop request skips or abandons leaves the state of the last one."""
        self.watchdog.arm()
        self.events.step_begins(self.state.step)
        before = self.checkpoints.rank_states()  # data position and RNG before this step
        micro, waited = take_batches(self.batches, self.cfg.grad_accum)
        every = 60 * self.cfg.save_every_minutes
        clock_due = self.env.is_main and every > 0 and time.monotonic() - self.last_save >= every
        ask_grad_norm(self.engine, self.cfg, self.job.optim, self._log_due(self.state.step + 1))
        checks = self.mid_step.needed(self.checkpoints.expected_save_s(), len(micro))
        budget = self.budget.flags(self.state.step + 1)
        host = [self.stop_request.requested, clock_due, checks, *budget]
        began = time.perf_counter()
        result = train_step(
            self.engine, micro, self.env, self.model_cfg.label_smoothing, host,
            nonfinite_flag(self.step_sums, self.env.device), self.abandon,
            step_guards_update(self.cfg, self.job.optim), LoopFlags.CHECKS,
        )  # fmt: skip
        self.mid_step.step_took(time.perf_counter() - began)
        flags = LoopFlags.of(result.flags)
        self.stopping, self.save_due = flags.stop, flags.save_due
        self.record = {}
        if not result.completed:  # skipped or abandoned on a stop request: undo what it read
            self.checkpoints.rewind(before)
            self.stopping = True
            if self.env.is_main and result.micro_batches_run:
                print(
                    f"step {self.state.step + 1} abandoned after {result.micro_batches_run} "
                    f"micro-batches: too little of train.stop_grace_s={self.cfg.stop_grace_s:g} "
                    f"left to finish it and save",
                    flush=True,
                )
            return
        self.step_sums = result.sums
        self.window.add(result.sums, batch_flops(self.model_cfg, micro), waited)
        self.state.step += 1
        self.events.step_ended(self.state.step)
        with self.timer.paused():  # a budget's calibration evaluates and decodes
            save_s, lr = self.checkpoints.expected_save_s(), self.engine.get_lr()[0]
            self.record |= self.budget.after_step(self.state.step, flags.budget, self.evaluator,
                                                  save_s, lr)  # fmt: skip
        self.nonfinite_streak = self.nonfinite_streak + 1 if flags.prev_nonfinite else 0
        if self.nonfinite_streak >= self.cfg.max_nonfinite:
            step, n = self.state.step, self.nonfinite_streak
            self.failure = (
                EXIT_NONFINITE,
                f"the loss was not finite in {n} consecutive steps ({step - n}-{step - 1}; "
                f"train.max_nonfinite={self.cfg.max_nonfinite}); stopped without saving, the "
                f"last checkpoint is {self.checkpoints.ckpts.latest_tag() or 'none'}",
            )

    def abandon(self, micro: int, check: bool) -> bool:
        """After micro-batch `micro`; in a step whose ranks agreed to `check` (MidStepStop), drop
        it when a stop request came too long ago to finish it and still save in time."""
        self.events.micro_batch_ended(self.state.step + 1, micro)
        return check and self.mid_step.agreed(
            self.checkpoints.expected_save_s(), self.env.world_size
        )

    def _final(self) -> bool:  # the last step of the run
        return self.state.step == self.budget.end_step() or self.budget.spent or self.target.reached

    def _log_due(self, step: int) -> bool:  # (a stop request or a spent budget: learnt later)
        first_or_last = (self.start_step + 1, self.budget.end_step())
        return step % self.cfg.log_every == 0 or step in first_or_last

    def maybe_log(self) -> None:
        """On log steps: one collective and one host sync for the window's sums, this rank's
        FLOPs and its skipped-sample counters, summed over ranks."""
        step = self.state.step
        due = self._log_due(step) or self._final()
        if not self.window.steps or not (due or self.stopping):
            return
        w = self.window.reduce(skipped_counts(self.stream))
        self.state.tokens_seen += int(w.src_tokens + w.tgt_tokens)
        self.record.update(w.rates(self.timer.lap(), self.env.world_size, self.peak))
        self.record.update(
            {
                "lr": self.engine.get_lr()[0],
                **optimizer_metrics(self.engine, self.cfg.precision),
                "tokens_seen": self.state.tokens_seen,
                "attempt": attempts.restart_count(),  # torchrun's restarts of the group so far
                **memory_metrics(self.env.device),
            }
        )
        if self.first_loss is None:
            self.first_loss = self.record["loss"]

    def maybe_evaluate(self) -> None:
        """Validation loss (and BLEU) when due, then the step's record goes to the sinks."""
        step = self.state.step
        due = (self.cfg.eval_every and step % self.cfg.eval_every == 0) or self._final()
        if not self.stopping and self.failure is None and due:
            with_bleu = (self.cfg.bleu_every and step % self.cfg.bleu_every == 0) or self._final()
            self.watchdog.arm()
            with self.timer.paused(), self.budget.clock.outside():
                self.record.update(self.evaluator.run(bool(with_bleu)))
                self.record |= self.target.check(step, self.record, self.budget.clock.spent_s())
        if self.record:
            self.last.update(self.record)
            self.logger.log(step, self.record)

    def maybe_save(self) -> None:
        """Save on save steps, at the end, on a stop request or when the clock says so; never
        a checkpoint of a step whose loss was not finite."""
        cfg, step = self.cfg, self.state.step
        if self.checkpoints.pending is not None:  # a background save: published once written
            self.publish(wait=False)
        due = (cfg.save_every and step % cfg.save_every == 0) or self._final()
        if self.failure is not None or not (due or self.stopping or self.save_due):
            return
        if self.step_sums is None or self.checkpoints.ckpts.latest_tag() == tag_for(step):
            return  # nothing finished since the last checkpoint (a stop before the first step)
        self.last_save = time.monotonic()
        self.watchdog.arm()
        self.budget.before_save()
        with self.timer.paused(), self.budget.clock.outside():
            if not loss_finite_everywhere(self.step_sums, self.env):
                if self.env.is_main:
                    stderr_warn(f"step {step}: the loss is not finite; no checkpoint saved")
                return
            background = cfg.async_save and not (self._final() or self.stopping)  # then: down
            self.publish(wait=True, then_save=(step, background))

    def publish(self, wait: bool, then_save: tuple[int, bool] | None = None) -> None:
        """Publish a background save once written (and then save `then_save`'s step)."""
        try:
            self.checkpoints.publish(wait)
            if then_save is not None:
                self.checkpoints.save(*then_save)
        except CheckpointError as exc:  # a failure already met stays the run's reason
            self.failure = self.failure or (EXIT_SAVE_FAILED, str(exc))

    # -- the end --------------------------------------------------------------------------

    def finish(self) -> dict[str, Any]:
        """The summary; a finished run exports its last checkpoint and plots its report."""
        env = self.env
        self.publish(wait=True)  # a background save still being written
        summary: dict[str, Any] = {
            "preempted": self.stopping,
            "precision": self.settled.precision.precision,
            "precision_reason": self.settled.precision.reason,
        }
        if self.failure is not None:
            summary |= {"exit_code": self.failure[0], "error": self.failure[1]}
            if env.is_main:
                print(f"paperscale: error: {self.failure[1]}", file=sys.stderr, flush=True)
        self.profiler.close()
        self.stream.close()
        if self.stopping and env.is_main:
            latest = self.checkpoints.ckpts.latest_tag() or "none (nothing trained yet)"
            step = self.state.step
            print(f"stopped at step {step} after a signal; latest checkpoint {latest}", flush=True)
        if env.is_main:
            summary |= self._figures()
        source = export_source(self.run.checkpoints)
        if env.is_main and source is not None and not self.stopping and self.failure is None:
            export_checkpoint(source, self.run.model, tokenizer_path(self.data_dir))
        torch.distributed.barrier()
        self.logger.close()
        if env.is_main and not self.stopping and self.job.logging.report:  # a stop: report later
            write_report_or_warn(self.run.root)
        return summary

    def _figures(self) -> dict[str, Any]:
        return {
            "steps": self.state.step,
            "steps_this_run": self.state.step - self.start_step,
            **self.budget.summary(),
            **self.target.summary(),
            "first_loss": self.first_loss,
            "valid_loss": self.last.get("valid_loss"),
            "bleu": self.last.get("bleu"),
            "tokens_per_s": self.last.get("tokens_per_s"),
            "elapsed_s": round(time.perf_counter() - self.started, 1),
            "run_dir": str(self.run.root),
        }
