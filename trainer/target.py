"""A quality target (`train.target_bleu`, `train.target_nll`): the run stops at the first
evaluation that reaches it, saves, and records the time it took, as MLPerf measures time to
quality: wall seconds from the start of training, evaluations and saves included, carried
across resumes (the seconds the checkpoint resumed from had spent; work lost to a crash after it
is not counted).

BLEU for a target is scored on the whole validation split at `train.bleu_every` (not the
`train.bleu_samples` subset), the NLL per target token at `train.eval_every`. Where it was
reached is kept in every checkpoint (`TrainState.target_step`), so a run resumed after that
evaluation (a kill before the end's export) ends at once instead of training on."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from trainer.state import TrainState


@dataclass
class Target:
    bleu: float  # 0: no BLEU target
    nll: float  # 0: no NLL target (nats per target token)
    state: TrainState

    @classmethod
    def of(cls, train: Any, state: TrainState) -> Target:
        return cls(float(train.target_bleu), float(train.target_nll), state)

    @property
    def active(self) -> bool:
        return self.bleu > 0 or self.nll > 0

    @property
    def reached(self) -> bool:
        """A target is set and the run reached it (this start or one before; a run resumed
        with its target taken away trains on)."""
        return self.active and self.state.target_step > 0

    def describe(self) -> str:
        parts = [f"BLEU >= {self.bleu:g}"] if self.bleu > 0 else []
        parts += [f"valid NLL <= {self.nll:g}"] if self.nll > 0 else []
        return " or ".join(parts)

    def check(self, step: int, record: dict[str, float], spent_s: float) -> dict[str, float]:
        """After an evaluation at `step`: whether it reached the target, rank 0's scores
        deciding for every rank (BLEU is scored there only). Returns the record's additions."""
        if not self.active or self.reached:
            return {}
        hit = self._hit(record)
        if dist.is_initialized() and dist.get_world_size() > 1:
            box = [(hit, spent_s)]
            dist.broadcast_object_list(box, src=0)
            hit, spent_s = box[0]
        if not hit:
            return {}
        self.state.target_step, self.state.time_to_target_s = step, round(spent_s, 1)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(self.line(), flush=True)
        return {"time_to_target_s": self.state.time_to_target_s}

    def _hit(self, record: dict[str, float]) -> bool:
        bleu, ppl = record.get("bleu"), record.get("valid_ppl")
        if self.bleu > 0 and bleu is not None and bleu >= self.bleu:
            return True
        return self.nll > 0 and ppl is not None and math.log(ppl) <= self.nll

    def line(self) -> str:
        """The one line rank 0 prints when the target is reached."""
        return (
            f"target reached at step {self.state.target_step}: {self.describe()} after "
            f"{self.state.time_to_target_s:g} s (train.target_*); saving and ending the run"
        )

    def summary(self) -> dict[str, Any]:
        if not self.active:
            return {}
        if not self.reached:
            return {"target": self.describe(), "target_reached": False}
        return {
            "target": self.describe(),
            "target_reached": True,
            "target_step": self.state.target_step,
            "time_to_target_s": self.state.time_to_target_s,
        }
