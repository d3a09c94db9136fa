"""Training-state objects: RNG round trip, train state, data positions (incl. the migration of
version-1 states), and the accumulation arithmetic of a world-size change (no processes)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from data_pipeline.position import (
    Counters,
    EpochProgress,
    WorkerPosition,
    progress_from_json,
    progress_to_json,
)
from trainer.checkpoint.disk import accumulation_for
from trainer.config import TrainConfig
from trainer.settle import with_train
from trainer.state import RngState, TrainState, rng_preserved


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_rng_round_trip_restores_every_stream() -> None:
    rng = RngState()
    saved = rng.state_dict()
    first = draws()
    rng.load_state_dict(saved)
    assert draws() == first
    # through torch.save / weights-only load, as the per-rank checkpoint file holds it
    import io

    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    rng.load_state_dict(torch.load(buf, weights_only=True))
    assert draws() == first


def test_rng_of_another_world_size_is_not_taken() -> None:
    rng = RngState()
    a = rng.state_dict()
    torch.rand(3)
    b = rng.state_dict()
    rng.load_rank_states([a, b], rank=1, world_size=2)
    assert torch.equal(torch.get_rng_state(), b["torch"])
    rng.load_rank_states([a, b], rank=0, world_size=3)  # a resize: the fresh seeding stays
    assert torch.equal(torch.get_rng_state(), b["torch"])


def test_rng_preserved_undoes_what_a_block_draws() -> None:
    before = RngState().state_dict()
    with rng_preserved():
        draws()
    assert torch.equal(RngState().state_dict()["torch"], before["torch"])
    assert random.getstate() == before["python"]


def test_train_state_round_trip() -> None:
    state = TrainState(step=7, tokens_seen=1234, wandb_id="abc")
    other = TrainState()
    other.load_state_dict({**state.state_dict(), "universal_checkpoint_info": {}})
    assert other == state


def test_worker_position_reads_version_1_and_writes_named_keys() -> None:
    v1 = {
        "epoch": 2, "idx": 3, "ws": 4000, "bd": 5,
        "counters": {"samples_seen": 10, "samples_skipped_long": 1,
                     "samples_skipped_corrupt": 2, "batches": 3, "bad_shards": ["s.tar"]},
    }  # fmt: skip
    pos = WorkerPosition.from_dict(v1)
    assert (pos.epoch, pos.unit_index, pos.window_start, pos.batches_done) == (2, 3, 4000, 5)
    assert pos.counters.bad_shards == ["s.tar"] and pos.started
    v2 = pos.to_dict()
    assert set(v2) == {"epoch", "unit_index", "window_start", "batches_done", "counters"}
    assert WorkerPosition.from_dict(v2) == pos
    pos.next_unit()
    assert (pos.unit_index, pos.started, pos.batches_done) == (4, False, 0)
    pos.next_epoch()
    assert (pos.epoch, pos.unit_index) == (3, 0)


def test_counters_add_names_a_bad_shard_once() -> None:
    a = Counters(samples_seen=3, bad_shards=["x"])
    a.add(Counters(samples_seen=2, batches=1, bad_shards=["x", "y"]))
    assert (a.samples_seen, a.batches, a.bad_shards) == (5, 1, ["x", "y"])
    assert Counters.from_dict(a.to_dict()) == a


def test_progress_json_round_trip_and_replay() -> None:
    progress = {1: EpochProgress({"0", "2:1/4"}, {"3": (100, 2)})}
    assert progress_from_json(progress_to_json(progress)) == progress
    progress[1].replay_windows()
    assert progress[1].partial == {"3": (100, 0)}


@pytest.mark.parametrize(
    ("accum", "old", "new", "expected"), [(2, 2, 1, 4), (1, 4, 2, 2), (3, 2, 3, 2), (1, 1, 1, 1)]
)
def test_accumulation_keeps_the_global_batch(accum: int, old: int, new: int, expected: int) -> None:
    assert accumulation_for(accum, old, new) == expected
    assert expected * new == accum * old


def test_accumulation_refuses_a_global_batch_it_cannot_keep() -> None:
    with pytest.raises(ValueError, match="not divisible by 4"):
        accumulation_for(3, 2, 4)


@dataclass
class _Job:
    train: TrainConfig = field(default_factory=TrainConfig)


def test_with_train_returns_new_values_and_leaves_the_inputs() -> None:
    job = _Job(TrainConfig(grad_accum=2, precision="auto"))
    resolved = {"train": {"grad_accum": 2, "precision": "auto"}}
    new_job, new_resolved = with_train(job, resolved, grad_accum=4, precision="fp32")  # type: ignore[arg-type]
    assert (new_job.train.grad_accum, new_job.train.precision) == (4, "fp32")
    assert new_resolved["train"] == {"grad_accum": 4, "precision": "fp32"}
    assert job.train.grad_accum == 2 and resolved["train"]["grad_accum"] == 2
