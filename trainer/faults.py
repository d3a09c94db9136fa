"""Fault injection for the fault tests: environment variables that make one rank fail on purpose.

Nothing here is active unless a `PAPERSCALE_FAULT_*` variable is set. The faults act on the rank
named by `PAPERSCALE_FAULT_RANK` (default 0):

  PAPERSCALE_FAULT_KILL_AT_STEP=3,6,8   SIGKILL itself right after optimizer step 3 (before that
                                        step is logged or saved); a comma list gives one step per
                                        attempt of torchrun `--max-restarts` (the i-th entry in
                                        the i-th attempt, from TORCHELASTIC_RESTART_COUNT)
  PAPERSCALE_FAULT_KILL_IN_SAVE=4:2,5:0:1  SIGKILL itself in the save of step 4 after this
                                        rank wrote its 2nd file (0: before the first); one
                                        STEP:FILES[:RANK] per attempt, as above (RANK overrides
                                        PAPERSCALE_FAULT_RANK)
  PAPERSCALE_FAULT_HANG_AT_STEP=3       sleep for an hour after step 3, between two collectives
                                        (a comma list: one step per attempt, as above)
  PAPERSCALE_FAULT_HANG_AT_START=build  sleep for an hour before entering that phase of the
                                        start-up (trainer/startup.py's PHASES)
  PAPERSCALE_FAULT_TERM_AT=4:0          SIGTERM to this rank's whole process group (as Slurm's
                                        preemption does) after micro-batch 0 of step 4
  PAPERSCALE_FAULT_NAN_FROM_STEP=4      the model's output is NaN from step 4 on
  PAPERSCALE_FAULT_SLOW_FROM_STEP=6:1.5 sleep 1.5 s after every step from step 6 on (a run
                                        slow enough for a signal from outside to find it
                                        still training); 6:1.5:20 up to step 19 only
  PAPERSCALE_FAULT_SKIP_SPACE_CHECK=1   save without the free-space check (to fill a disk)

One acts on a node of a Slurm job instead (launch/slurm/rendezvous.py):

  PAPERSCALE_FAULT_ABSENT_NODE=1        the task of node 1 never starts torchrun (a node that
                                        never joins the rendezvous)
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from trainer.events import LoopObserver

PREFIX = "PAPERSCALE_FAULT_"


def _for_attempt(value: str, attempt: int) -> str | None:
    """The entry of a comma list that applies to this attempt (None when the list is shorter)."""
    items = [x.strip() for x in value.split(",") if x.strip()]
    return items[attempt] if attempt < len(items) else None


@dataclass
class Faults(LoopObserver):
    """The faults this rank injects, read once from the environment; it watches the loop
    (trainer/events.py) and the checkpoint manager's saves."""

    kill_at_step: int | None = None
    kill_in_save: tuple[int, int] | None = None  # (step, files written before the kill)
    hang_at_step: int | None = None
    nan_from_step: int | None = None
    term_at: tuple[int, int] | None = None  # (step, micro-batch)
    slow_from: tuple[int, float] | None = None  # (step, seconds of sleep after each step)
    slow_until: int | None = None  # the first step no longer slowed (None: never)
    skip_space_check: bool = False
    step: int = 0  # the step being run or saved, kept current by the loop
    files_written: int = 0  # files this rank wrote in the save under way

    @classmethod
    def from_env(cls, rank: int, environ: dict[str, str] | None = None) -> Faults:
        env = dict(os.environ if environ is None else environ)
        faults = cls(skip_space_check=env.get(PREFIX + "SKIP_SPACE_CHECK", "") == "1")
        fault_rank = int(env.get(PREFIX + "RANK", "0"))
        attempt = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))  # set by torchrun
        if in_save := _for_attempt(env.get(PREFIX + "KILL_IN_SAVE", ""), attempt):
            step, files, *on_rank = (int(x) for x in in_save.split(":"))
            if (on_rank[0] if on_rank else fault_rank) == rank:
                faults.kill_in_save = (step, files)
        if fault_rank != rank:
            return faults
        if kill := _for_attempt(env.get(PREFIX + "KILL_AT_STEP", ""), attempt):
            faults.kill_at_step = int(kill)
        if hang := _for_attempt(env.get(PREFIX + "HANG_AT_STEP", ""), attempt):
            faults.hang_at_step = int(hang)
        if nan := env.get(PREFIX + "NAN_FROM_STEP"):
            faults.nan_from_step = int(nan)
        if slow := env.get(PREFIX + "SLOW_FROM_STEP"):
            step, seconds, *until = slow.split(":")
            faults.slow_from = (int(step), float(seconds))
            faults.slow_until = int(until[0]) if until else None
        if term := env.get(PREFIX + "TERM_AT"):
            step, micro = (int(x) for x in term.split(":"))
            faults.term_at = (step, micro)
        return faults

    def install(self, module: torch.nn.Module) -> None:
        """Hook the model so that its output turns NaN once `nan_from_step` is reached."""
        if self.nan_from_step is None:
            return

        def poison(mod: torch.nn.Module, args: Any, output: Any) -> Any:
            """NaN logits, or a NaN loss and nll from the training forward's loss sums."""
            if not (mod.training and self.step >= (self.nan_from_step or 0)):
                return output
            if isinstance(output, tuple):
                loss, nll, *rest = output
                return (loss * float("nan"), nll * float("nan"), *rest)
            return output * float("nan")

        module.register_forward_hook(poison)

    def step_begins(self, done: int) -> None:
        self.step = done + 1

    def step_ended(self, step: int) -> None:
        """Between the optimizer step and the step's logging collective."""
        if step == self.kill_at_step:
            _announce(f"SIGKILL after step {step}")
            os.kill(os.getpid(), signal.SIGKILL)
        if step == self.hang_at_step:  # (its frame is where the watchdog's report says)
            _announce(f"hanging after step {step}")
            time.sleep(3600)
        slowed = self.slow_from is not None and self.slow_from[0] <= step
        if slowed and (self.slow_until is None or step < self.slow_until):
            time.sleep(self.slow_from[1])  # type: ignore[index]

    def micro_batch_ended(self, step: int, micro: int) -> None:
        """After each micro-batch of a step but the last."""
        if (step, micro) == self.term_at:
            _announce(f"SIGTERM to the process group after micro-batch {micro} of step {step}")
            os.killpg(os.getpgrp(), signal.SIGTERM)

    def save_started(self, step: int) -> None:
        self.files_written = 0
        self._maybe_kill_in_save(step)

    def file_written(self, step: int) -> None:
        self.files_written += 1
        self._maybe_kill_in_save(step)

    def _maybe_kill_in_save(self, step: int) -> None:
        if self.kill_in_save == (step, self.files_written):
            _announce(f"SIGKILL in the save of step {step} after {self.files_written} files")
            os.kill(os.getpid(), signal.SIGKILL)


def start_hang(rank: int, environ: dict[str, str] | None = None) -> str:
    """The start-up phase this rank never enters (PAPERSCALE_FAULT_HANG_AT_START), or ''."""
    env = os.environ if environ is None else environ
    if int(env.get(PREFIX + "RANK", "0")) != rank:
        return ""
    return env.get(PREFIX + "HANG_AT_START", "")


def hang(what: str) -> None:
    """Announce the fault, then sleep for an hour (a rank that never answers)."""
    _announce(what)
    time.sleep(3600)


def _announce(what: str) -> None:
    print(f"fault injected: rank {os.environ.get('RANK', '0')} {what} at {time.time():.3f}",
          file=sys.stderr, flush=True)  # fmt: skip
