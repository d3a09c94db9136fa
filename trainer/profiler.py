"""`profile.enabled`: a torch.profiler trace of a few steps of a real run, and the table of
where their time went (trainer/step_time.py).

RUN/profile/step_<first>-<last>/ gets, for every rank, `rank_NNNNN.trace.json` (Chrome trace
format: open it in https://ui.perfetto.dev or chrome://tracing) and `rank_NNNNN.groups.json`
(milliseconds per step by group, the top ops of each group); rank 0 writes `table.txt`, the
grouped table of all ranks, and prints it. On CUDA each rank also writes
`rank_NNNNN.memory.pickle`, a snapshot of the allocator's history over the profiled steps
(drag it into https://pytorch.org/memory_viz).

The schedule counts the steps of this process: `wait_steps` first (allocator, first shapes,
compilation), then `warmup_steps` recorded and discarded (the profiler's own start-up), then
`steps` recorded. A run that ends earlier records nothing, and says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.profiler_util import FunctionEvent

from trainer.config import ProfileConfig
from trainer.dist import DistEnv
from trainer.events import LoopObserver
from trainer.run_dir import RunDir
from trainer.step_time import OpTime, StepTimes, format_table, step_times

STEP_EVENT = "ProfilerStep"  # `ProfilerStep#N` in the trace, `ProfilerStep*` in its events


class StepProfiler(LoopObserver):
    """Drives torch.profiler over the loop's steps: `step_begins` at the start of each,
    `close` at the end (every rank calls both at the same steps)."""

    def __init__(self, job: Any, precision: str, run: RunDir, env: DistEnv) -> None:
        self.cfg: ProfileConfig = job.profile
        self.run, self.env = run, env
        self.what = (
            f"{precision} on {env.device.type}, {env.world_size} ranks x "
            f"{job.train.grad_accum} micro-batches of {job.data.max_tokens} tokens"
        )
        self.prof: torch.profiler.profile | None = None
        self.first_step = 0  # the first recorded (global) step
        self.steps_seen = 0
        self.out_dir: Path | None = None  # where the last recording went

    @property
    def cuda(self) -> bool:
        return self.env.device.type == "cuda"

    def step_begins(self, done: int) -> None:
        """At the start of every step, `done` steps finished before it. The first call starts
        the profiler; each later one ends the profiler's previous step, so that a recorded
        step is one training step with its logging (and an evaluation or save due then)."""
        if not self.cfg.enabled:
            return
        if self.prof is None:
            if self.steps_seen == 0:
                self._start(done)
            self.steps_seen = max(self.steps_seen, 1)
            return
        if self.cuda and self.cfg.memory and self.steps_seen == self.cfg.wait_steps:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        self.steps_seen += 1
        self.prof.step()

    def _start(self, done: int) -> None:
        cfg = self.cfg
        self.first_step = done + cfg.wait_steps + cfg.warmup_steps + 1
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        counted = torch.profiler.schedule(
            wait=cfg.wait_steps, warmup=cfg.warmup_steps, active=cfg.steps, repeat=1
        )
        self.prof = torch.profiler.profile(
            activities=activities,
            schedule=lambda n: counted(max(n - done - 1, 0)),  # n: the training step
            on_trace_ready=self._ready,
            record_shapes=cfg.record_shapes,
            with_stack=cfg.with_stack,
        )
        self.prof.step_num = done + 1  # so that the trace's ProfilerStep#N is step N
        self.prof.start()

    def close(self) -> None:
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.stop()  # writes the recording when the run ended with its last step
        if self.out_dir is None and self.env.is_main:
            print(
                f"profile: the run ended before step {self.first_step + self.cfg.steps - 1}, "
                "the last one to record; nothing written",
                file=sys.stderr,
                flush=True,
            )

    # -- output ---------------------------------------------------------------------------

    def _ready(self, prof: torch.profiler.profile) -> None:
        """The recorded steps are over (every rank at the same step): write them."""
        cfg, env = self.cfg, self.env
        last = self.first_step + cfg.steps - 1
        out = self.run.profile(self.first_step, last)
        out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out / f"rank_{env.rank:05d}.trace.json"))
        times = times_of(prof.events(), cfg.steps, self.cuda)
        (out / f"rank_{env.rank:05d}.groups.json").write_text(
            json.dumps({"rank": env.rank, **times.as_dict()}, indent=1) + "\n"
        )
        if self.cuda and cfg.memory:
            torch.cuda.memory._dump_snapshot(str(out / f"rank_{env.rank:05d}.memory.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
        per_rank: list[Any] = [None] * env.world_size
        dist.all_gather_object(per_rank, times)
        if env.is_main:
            title = (
                f"where a step's time went: steps {self.first_step}-{last} "
                f"({cfg.steps} after {cfg.warmup_steps} warm-up), {self.what}"
            )
            table = format_table(per_rank, title)
            (out / "table.txt").write_text(table + "\n")
            print(f"{table}\nprofile: trace and tables in {out}", flush=True)
        self.out_dir = out


def times_of(events: list[FunctionEvent], steps: int, on_device: bool) -> StepTimes:
    """The grouped step times of a profiler's events: CPU time of the ops of the thread that
    ran the steps, or on a GPU the device time of the kernels every op launched."""
    marks = [e for e in events if e.name.startswith(STEP_EVENT)]
    wall_us = sum(e.cpu_time_total for e in marks)
    thread = marks[0].thread if marks else None
    ops = []
    for event in events:
        if event.name.startswith(STEP_EVENT):
            continue
        if on_device:
            own = event.self_device_time_total
        elif event.thread == thread:
            own = event.self_cpu_time_total
        else:
            continue
        if own > 0:
            ops.append(OpTime(event.name, float(own), ancestors_of(event)))
    return step_times(ops, max(len(marks), 1) if marks else steps, wall_us)


def ancestors_of(event: FunctionEvent) -> tuple[str, ...]:
    names = []
    parent = event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return tuple(reversed(names))
