"""The checkpoint manager on a real DeepSpeed engine in this process (a world of one, gloo):
save -> change everything -> restore gives back the weights, the optimizer, the train state,
the data position and the RNG; retention; a failed write leaves `latest` alone; observers."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from launch.config import load_config
from model.config import ModelConfig
from model.loss import label_smoothed_loss
from trainer.checkpoint.disk import CheckpointError
from trainer.checkpoint.manager import CheckpointManager
from trainer.dist import DistEnv
from trainer.ds.engine import build_engine
from trainer.run_dir import RunDir
from trainer.state import RngState, TrainState

pytestmark = pytest.mark.xdist_group("checkpointer")  # a module-scoped process group: one worker

TINY = [
    "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.encoder_layers=1",
    "model.decoder_layers=1", "model.vocab_size=32", "train.zero_stage=2",
    "train.precision=fp32", "optim.lr=0.01", "optim.warmup_steps=2",
]  # fmt: skip


@pytest.fixture
def env(rank_env: DistEnv) -> DistEnv:
    return rank_env


class Position:
    """A per-rank state standing in for the data stream's position."""

    def __init__(self) -> None:
        self.value = 0
        self.loaded: list[Any] = []

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_rank_states(self, states: list[dict[str, Any]], rank: int, world_size: int) -> None:
        self.loaded = states
        self.value = states[rank]["value"]


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def save_started(self, step: int) -> None:
        self.events.append(("start", step))

    def file_written(self, step: int) -> None:
        self.events.append(("file", step))


def make(env: DistEnv, tmp_path: Path, keep_last: int = 2) -> tuple[Any, CheckpointManager]:
    job = load_config(None, TINY)
    cfg = ModelConfig(**job.model.__dict__)
    torch.manual_seed(0)
    engine = build_engine(job, cfg, env)
    manager = CheckpointManager(
        RunDir(tmp_path).checkpoints, engine, 0, 1, TrainState(wandb_id="w1"),
        {"data": Position(), "rng": RngState()}, keep_last=keep_last,
        meta={"model": cfg.__dict__, "config": {"train": {"precision": "fp32"}}},
        precision="fp32", observers=[Recorder()],
    )  # fmt: skip
    return engine, manager


def train_one_step(engine: Any) -> None:
    src = torch.randint(4, 32, (4, 6))  # (B, S)
    tgt = torch.randint(4, 32, (4, 7))  # (B, T + 1)
    loss, _, n = label_smoothed_loss(engine(src, tgt[:, :-1]), tgt[:, 1:], 0.1)
    engine.backward(loss / n)
    engine.step()


def weights(engine: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def test_save_then_restore_gives_back_every_state(env: DistEnv, tmp_path: Path) -> None:
    engine, manager = make(env, tmp_path)
    train_one_step(engine)
    manager.train_state.step, manager.train_state.tokens_seen = 1, 99
    manager.per_rank["data"].value = 42  # type: ignore[attr-defined]
    tag = manager.save(1)
    saved_weights, saved_rng = weights(engine), torch.get_rng_state()
    ckpts = manager.ckpts
    assert ckpts.latest_tag() == tag and ckpts.is_complete(tag)
    assert ckpts.read_meta(tag)["config"]["train"]["precision"] == "fp32"
    observed = manager.observers[0].events  # type: ignore[attr-defined]
    assert observed[0] == ("start", 1) and observed.count(("file", 1)) >= 4

    train_one_step(engine)  # move everything on
    manager.train_state.step = 2
    manager.per_rank["data"].value = 7  # type: ignore[attr-defined]
    torch.rand(5)
    assert any(not torch.equal(saved_weights[k], v) for k, v in weights(engine).items())

    manager.restore(tag)
    assert all(torch.equal(saved_weights[k], v) for k, v in weights(engine).items())
    assert (manager.train_state.step, manager.train_state.tokens_seen) == (1, 99)
    assert manager.train_state.wandb_id == "w1"
    assert manager.per_rank["data"].value == 42  # type: ignore[attr-defined]
    assert torch.equal(torch.get_rng_state(), saved_rng)
    # the restored optimizer continues like the saved one: one more step from both is equal
    torch.manual_seed(5)
    train_one_step(engine)
    after_restore = weights(engine)
    manager.restore(tag)
    torch.manual_seed(5)
    train_one_step(engine)
    assert all(torch.equal(after_restore[k], v) for k, v in weights(engine).items())


def test_keeps_the_last_n_complete_checkpoints(env: DistEnv, tmp_path: Path) -> None:
    engine, manager = make(env, tmp_path, keep_last=2)
    for step in (1, 2, 3):
        train_one_step(engine)
        manager.save(step)
    assert manager.ckpts.complete_tags() == ["step_00000002", "step_00000003"]
    assert manager.ckpts.latest_tag() == "step_00000003"


def test_a_failed_write_keeps_latest_and_removes_the_partial_save(
    env: DistEnv, tmp_path: Path
) -> None:
    engine, manager = make(env, tmp_path)
    train_one_step(engine)
    manager.save(1)

    def full_disk(state_dict: Any, path: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    original = engine.checkpoint_engine.save
    engine.checkpoint_engine.save = full_disk
    try:
        with pytest.raises(CheckpointError, match="No space left on device") as err:
            manager.save(2)
    finally:
        engine.checkpoint_engine.save = original
    assert "the last complete checkpoint is step_00000001" in str(err.value)
    assert manager.ckpts.latest_tag() == "step_00000001"
    assert not manager.ckpts.tag_dir("step_00000002").exists()
    manager.save(2)  # the same step saves once the disk has room again
    assert manager.ckpts.latest_tag() == "step_00000002"


def test_refuses_to_start_a_save_without_room(env: DistEnv, tmp_path: Path) -> None:
    _, manager = make(env, tmp_path)
    manager.n_params = 10**15  # a checkpoint no disk holds
    with pytest.raises(CheckpointError, match="not saving checkpoint step_00000001: it needs"):
        manager.save(1)
    assert manager.ckpts.latest_tag() is None
    assert manager.observers[0].events == []  # type: ignore[attr-defined]


def test_a_background_save_holds_the_state_of_its_step(env: DistEnv, tmp_path: Path) -> None:
    """train.async_save: the state is copied at the save; training goes on while the files
    are written; `latest` moves only at publish; the checkpoint restores the saved step's
    weights, optimizer and per-rank states exactly (training on from it repeats the step
    the live state took after the save, bitwise)."""
    engine, manager = make(env, tmp_path)
    train_one_step(engine)
    manager.save(1)
    train_one_step(engine)
    manager.train_state.step = 2
    manager.per_rank["data"].value = 42  # type: ignore[attr-defined]
    saved_weights = weights(engine)
    gate, original = threading.Event(), engine.checkpoint_engine.save

    def held_write(state_dict: Any, path: str) -> None:
        gate.wait(60)  # the files are written only after training has moved on
        original(state_dict, path)

    engine.checkpoint_engine.save = held_write
    try:
        tag = manager.save(2, background=True)
    finally:
        engine.checkpoint_engine.save = original
    assert manager.pending is not None and manager.ckpts.latest_tag() == "step_00000001"
    assert manager.publish(wait=False) is None  # still writing
    torch.manual_seed(5)
    train_one_step(engine)  # moves the live state on before the files are written
    continued = weights(engine)
    manager.per_rank["data"].value = 7  # type: ignore[attr-defined]
    gate.set()
    manager.pending.writes.wait()
    assert manager.ckpts.latest_tag() == "step_00000001"  # written, not yet published
    assert manager.publish(wait=False) == tag and manager.pending is None
    assert manager.ckpts.latest_tag() == tag and manager.ckpts.is_complete(tag)
    observed = manager.observers[0].events  # type: ignore[attr-defined]
    assert observed.count(("file", 2)) == observed.count(("file", 1))  # the same files

    manager.restore(tag)
    assert all(torch.equal(saved_weights[k], v) for k, v in weights(engine).items())
    assert manager.per_rank["data"].value == 42  # type: ignore[attr-defined]
    torch.manual_seed(5)
    train_one_step(engine)  # Adam's moments and step count came back too
    assert all(torch.equal(continued[k], v) for k, v in weights(engine).items())


def test_a_failed_background_write_keeps_latest(env: DistEnv, tmp_path: Path) -> None:
    engine, manager = make(env, tmp_path)
    train_one_step(engine)
    manager.save(1)
    calls = []

    def full_disk(state_dict: Any, path: str) -> None:
        calls.append(path)
        raise OSError(errno.ENOSPC, "No space left on device")

    original = engine.checkpoint_engine.save
    engine.checkpoint_engine.save = full_disk  # what the background thread will write with
    try:
        manager.save(2, background=True)
    finally:
        engine.checkpoint_engine.save = original
    with pytest.raises(CheckpointError, match="No space left on device") as err:
        manager.publish(wait=True)
    assert len(calls) == 1  # the first failed write ends the background save
    assert "checkpoint step_00000002 not saved" in str(err.value)
    assert manager.ckpts.latest_tag() == "step_00000001" and manager.pending is None
    assert not manager.ckpts.tag_dir("step_00000002").exists()
    manager.save(2, background=True)
    assert manager.publish(wait=True) == "step_00000002"


def test_a_save_waits_for_the_one_pending(env: DistEnv, tmp_path: Path) -> None:
    engine, manager = make(env, tmp_path, keep_last=2)
    for step in (1, 2, 3):
        train_one_step(engine)
        manager.save(step, background=step < 3)
    assert manager.pending is None
    assert manager.ckpts.complete_tags() == ["step_00000002", "step_00000003"]
    assert manager.last_stall_s is not None and manager.last_save_s is not None
