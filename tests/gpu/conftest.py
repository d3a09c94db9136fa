"""Fixtures of the CUDA tests (`make test-gpu`): a world of one on the GPU (nccl) in the pytest
process, and the prepared synthetic data of the integration tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from tests.integration.conftest import synthetic_data  # noqa: F401  (a fixture)
from trainer.dist import DistEnv, free_port, init_distributed

WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="session")
def cuda_world() -> Iterator[DistEnv]:
    """One rank on GPU 0 for the whole session (DeepSpeed keeps the first group it saw)."""
    if not torch.cuda.is_available():
        pytest.fail("the gpu tests need a CUDA device (run them with `make test-gpu` on one)")
    saved = {k: os.environ.get(k) for k in WORLD_VARS}
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    try:
        env = init_distributed("cuda")
    finally:  # subprocesses of the session must not look like a rank
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield env
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture
def cuda_rank(cuda_world: DistEnv, monkeypatch: pytest.MonkeyPatch) -> DistEnv:
    """The world of one, with a rank's variables set for this test only (DeepSpeed reads
    LOCAL_RANK when it builds an engine)."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    return cuda_world
