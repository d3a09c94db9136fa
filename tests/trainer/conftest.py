"""A world of one (gloo) in the pytest process, for the tests that build a real DeepSpeed
engine here. One per worker for the whole session: DeepSpeed keeps groups of the first
process group it saw, so a second init after a destroy breaks its engines."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from trainer.dist import DistEnv, free_port

WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")


@pytest.fixture(scope="session")
def world_of_one() -> Iterator[DistEnv]:
    saved = {k: os.environ.get(k) for k in WORLD_VARS}
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    # a free port: another pytest-xdist worker may hold a process group too
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    import deepspeed

    try:
        deepspeed.init_distributed(dist_backend="gloo")
    finally:  # the rest of the session (and its subprocesses) must not look like a rank
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture
def rank_env(world_of_one: DistEnv, monkeypatch: pytest.MonkeyPatch) -> DistEnv:
    """The world of one, with the variables of a rank set for this test only (DeepSpeed reads
    LOCAL_RANK when it builds an engine)."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    return world_of_one
