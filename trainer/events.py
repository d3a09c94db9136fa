"""What the training loop tells whoever watches its steps: the profiler (trainer/profiler.py)
and fault injection (trainer/faults.py) take the same three calls, so that the loop has one seam
for both, as the checkpoint manager has its save observers."""

from __future__ import annotations

from collections.abc import Sequence


class LoopObserver:
    """The loop's events; each is a no-op here, so an observer defines only those it uses."""

    def step_begins(self, done: int) -> None:
        """A step starts; `done` steps finished before it."""

    def micro_batch_ended(self, step: int, micro: int) -> None:
        """Micro-batch `micro` of step `step` (counted from 1) ended, and it was not the last."""

    def step_ended(self, step: int) -> None:
        """Step `step` ended: after the optimizer update, before the step's logging."""


class LoopEvents(LoopObserver):
    """Every observer, told in order."""

    def __init__(self, observers: Sequence[LoopObserver]) -> None:
        self.observers = list(observers)

    def step_begins(self, done: int) -> None:
        for observer in self.observers:
            observer.step_begins(done)

    def micro_batch_ended(self, step: int, micro: int) -> None:
        for observer in self.observers:
            observer.micro_batch_ended(step, micro)

    def step_ended(self, step: int) -> None:
        for observer in self.observers:
            observer.step_ended(step)
