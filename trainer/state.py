"""The training state that is not the engine's: typed, each with `state_dict`/`load_state_dict`.

- `TrainState`: step, tokens seen, the wandb run id; shared by all ranks (rank 0 saves it).
- `RngState`: this rank's Python, NumPy and torch generators (dropout differs per rank, so each
  rank saves its own).
- `DataPosition`: this rank's position in the training stream (data_pipeline/loader.py); on a
  resume it takes the positions of *all* ranks of the saving run, whatever their number.

The checkpoint manager (trainer/checkpoint/manager.py) saves and restores them; nothing else builds
their dicts.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from trainer.schedule import Horizon


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RankStateful(Protocol):
    """A per-rank state: saved by every rank, restored from the states of all saving ranks
    (or, to undo a step in flight, from this rank's own earlier state)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def load_rank_states(self, states: list[dict[str, Any]], rank: int, world_size: int) -> None:
        """Continue from `states` (index = saving rank) as rank `rank` of `world_size`."""
        ...


@dataclass
class TrainState:
    """Where the run is: optimizer steps taken, source + target tokens seen (all ranks), the
    wandb run id that every restart of the run logs to, and for a run on a budget
    (trainer/budget.py) the schedule's horizon once fixed and the seconds spent so far."""

    step: int = 0
    tokens_seen: int = 0
    wandb_id: str = ""
    # the scheduler reads this object: restoring changes its fields, never replaces it
    horizon: Horizon = field(default_factory=Horizon)
    budget_spent_s: float = 0.0
    # a quality target (trainer/target.py): the step that reached it and the seconds it took
    target_step: int = 0
    time_to_target_s: float = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "wandb_id": self.wandb_id,
            "horizon_steps": self.horizon.total_steps,
            "horizon_decay_from": self.horizon.decay_from,
            "budget_spent_s": self.budget_spent_s,
            "target_step": self.target_step,
            "time_to_target_s": self.time_to_target_s,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])
        self.wandb_id = str(state["wandb_id"])
        if "horizon_steps" in state:  # checkpoints of runs without a budget may lack them
            self.horizon.total_steps = int(state["horizon_steps"])
            self.horizon.decay_from = int(state["horizon_decay_from"])
            self.budget_spent_s = float(state["budget_spent_s"])
        self.target_step = int(state.get("target_step", 0))  # older checkpoints lack them
        self.time_to_target_s = float(state.get("time_to_target_s", 0.0))


class RngState:
    """This process's random generators (Python, NumPy, torch, CUDA) in a form that
    `torch.load(weights_only=True)` reads back."""

    def state_dict(self) -> dict[str, Any]:
        np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
        state: dict[str, Any] = {
            "python": random.getstate(),
            "numpy": {
                "name": str(np_name),
                "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
                "pos": int(np_pos),
                "has_gauss": int(np_has_gauss),
                "gauss": float(np_gauss),
            },
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        n = state["numpy"]
        np.random.set_state(
            (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
        )
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])

    def load_rank_states(self, states: list[dict[str, Any]], rank: int, world_size: int) -> None:
        """This rank's own streams; on another number of ranks the fresh per-rank seeding
        stays (no old rank's stream belongs to a new rank)."""
        if len(states) == world_size:
            self.load_state_dict(states[rank])


@contextlib.contextmanager
def rng_preserved() -> Iterator[None]:
    """Run a block without moving the random streams: what it draws is undone afterwards.

    Setting up sinks, probing the hardware and evaluating must not shift the dropout stream,
    or a resumed run (which does these at other steps) would train differently."""
    rng = RngState()
    saved = rng.state_dict()
    try:
        yield
    finally:
        rng.load_state_dict(saved)


class DataPosition:
    """The training stream's position as a per-rank state (the stream keeps it current)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """This rank's own position (same world), e.g. the one before an abandoned step."""
        self.stream.load_state_dict(state)

    def load_rank_states(self, states: list[dict[str, Any]], rank: int, world_size: int) -> None:
        """Every saving rank's position: exact continuation on the same world, else the
        unfinished part of the epoch re-dealt over the new ranks."""
        self.stream.load_state_dicts(states)
