"""Stop requests from the scheduler or the user, turned into a save-and-exit at a step boundary.

SIGUSR1 (Slurm's `--signal=USR1@90` before the time limit) and SIGTERM (preemption, `scancel`,
sent to every process of the job) ask the job to save a checkpoint and exit with
EXIT_PREEMPTED within `train.stop_grace_s`. The first SIGINT does the same; a second SIGINT exits
at once. Ranks agree on the stop through the all-reduce the train step already makes, so a
signal that reaches one rank stops them all at the same step: a step not started yet is not run,
and one in flight is finished if that leaves time to save, else abandoned at the next
micro-batch (its gradients dropped, the data position and RNG put back to where the step
began), so the checkpoint is always that of the last finished step.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import sys
import time
from collections import deque
from pathlib import Path
from types import FrameType
from typing import TextIO

# Exit code after a requested stop that saved a checkpoint (EX_TEMPFAIL: "try again later").
EXIT_PREEMPTED = 75
# train.max_nonfinite consecutive steps with a NaN/inf loss: stopped without saving (EX_DATAERR).
EXIT_NONFINITE = 65
# A checkpoint could not be written (no space, I/O error): stopped, the last one kept (EX_IOERR).
EXIT_SAVE_FAILED = 74


class Watchdog:
    """Ends this process when one phase of the loop -- a train step, an evaluation, a save --
    runs past `timeout_s`: SIGALRM from a timer, which writes every thread's stack to
    `stack_file` (RUN/logs/watchdog-<attempt>-rank<r>.txt; stderr without one) and then kills
    the process (exit status 128 + SIGALRM). torchrun restarts the group; the next attempt's
    rank 0 reports where each stuck rank was (trainer/attempts.py `report_watchdogs`).

    Collectives time out by themselves (the process group's timeout); this catches a rank that
    is stuck outside them, so that no rank of a broken job waits forever. A timer rather than a
    thread: nothing runs beside the loop (forked data-loader workers inherit no timer).
    """

    def __init__(self, timeout_s: float, stack_file: Path | None = None) -> None:
        self.timeout_s = timeout_s
        self.stack_file = stack_file
        self._file: TextIO | None = None
        self._registered = False

    def arm(self) -> None:
        if not self._registered:
            out: TextIO = sys.stderr
            if self.stack_file is not None:
                self.stack_file.parent.mkdir(parents=True, exist_ok=True)
                out = self._file = open(self.stack_file, "w")  # noqa: SIM115 -- open until disarm
            faulthandler.register(signal.SIGALRM, file=out, all_threads=True, chain=True)
            self._registered = True
        signal.setitimer(signal.ITIMER_REAL, self.timeout_s)

    def disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if self._registered:
            faulthandler.unregister(signal.SIGALRM)
            self._registered = False
        if self._file is not None:
            self._file.close()
            self._file = None
            if self.stack_file is not None and self.stack_file.stat().st_size == 0:
                self.stack_file.unlink()  # it never fired


def stuck_at(stacks: str) -> str:
    """Where the main thread of a watchdog's dump was: its innermost frame, and the innermost
    frame of this project's code when that is another ("all_reduce at .../distributed_c10d.py:
    3252, from trainer/loop.py:267 maybe_log")."""
    lines = stacks.splitlines()
    start = next((i for i, x in enumerate(lines) if x.startswith("Current thread")), None)
    frames = []
    for line in lines[start + 1 if start is not None else 0 :]:
        match = FRAME.match(line)
        if not match:
            break
        frames.append(match.groups())
    if not frames:
        return "an unknown place (no stack in the dump)"
    path, lineno, func = frames[0]
    where = f"{func} at {path}:{lineno}"
    ours = next(((p, n, f) for p, n, f in frames if OWN_CODE.search(p)), None)
    if ours is not None and ours != frames[0]:
        where += f", from {OWN_CODE.search(ours[0]).group(0)}:{ours[1]} {ours[2]}"  # type: ignore[union-attr]
    return where


FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (\S+)')
OWN_CODE = re.compile(r"(trainer|data_pipeline|model|launch)/[\w/]+\.py$")


class StopRequest:
    """Records the first stop signal and when it came; a second SIGINT ends the process
    immediately."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.received_at: float | None = None  # time.monotonic() of the first stop signal
        self._previous: dict[int, object] = {}

    def past(self, seconds_after: float) -> bool:
        """Whether a stop was requested at least `seconds_after` seconds ago."""
        return self.received_at is not None and (
            time.monotonic() - self.received_at >= seconds_after
        )

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def install(self) -> StopRequest:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            print("second SIGINT: exiting now without saving", file=sys.stderr, flush=True)
            os._exit(130)
        if not self.requested:
            self.signal_name = name
            self.received_at = time.monotonic()
            print(
                f"{name} received: finishing this step, saving, then exiting",
                file=sys.stderr,
                flush=True,
            )


class LoopGuard:
    """The loop's duration: afterwards the watchdog is disarmed and the stop-signal handler
    (installed when `train` began) removed."""

    def __init__(self, stop_request: StopRequest, watchdog: Watchdog) -> None:
        self.stop_request, self.watchdog = stop_request, watchdog

    def __enter__(self) -> LoopGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.watchdog.disarm()
        self.stop_request.uninstall()


RECENT_STEPS = 8  # MidStepStop prices a step by the longest of these (a compiling first drops out)


class MidStepStop:
    """Whether a step in flight is abandoned on a stop request (its gradients dropped before
    the update), agreed by every rank after each micro-batch but the last.

    That agreement is a host-side all-reduce per micro-batch boundary (across nodes where the
    job spans them). It is only needed where a stop arriving at a step's start could not wait
    for the step's end and still save within train.stop_grace_s: `needed` says so from the
    longest of this process's last RECENT_STEPS steps (twice it, for safety; unknown before the
    first step, so needed then) and the expected save, and travels in the step's one collective
    as a flag, so all ranks agree whether to check. Elsewhere a stop waits for the step's end: no
    collective between micro-batches."""

    def __init__(self, stop: StopRequest, grace_s: float, margin_s: float, group: object) -> None:
        self.stop, self.grace_s, self.margin_s, self.group = stop, grace_s, margin_s, group
        self.recent: deque[float] = deque(maxlen=RECENT_STEPS)  # seconds of the last steps

    def step_took(self, seconds: float) -> None:
        self.recent.append(seconds)

    def needed(self, save_s: float, micro_batches: int) -> bool:
        if micro_batches < 2:
            return False
        if not self.recent:
            return True
        return 2 * max(self.recent) + save_s + self.margin_s >= self.grace_s

    def agreed(self, save_s: float, world_size: int) -> bool:
        """After a micro-batch, in a step that checks: whether the stop request (on any rank)
        came too long ago to finish the step and still save in time."""
        import torch
        import torch.distributed as dist

        late = self.stop.past(self.grace_s - save_s - self.margin_s)
        if world_size == 1:
            return late
        flag = torch.tensor([float(late)])
        dist.all_reduce(flag, group=self.group)  # type: ignore[arg-type]
        return bool(flag.item() > 0)
