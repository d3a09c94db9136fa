"""Why each rank restores its own RNG: a plain DeepSpeed save / load, on 2 CPU ranks (gloo,
ZeRO 2, fp32, dropout 0.1), for DeepSpeed's FusedAdam (a Python int `step`) and torch.optim.Adam
(a tensor `step`). Each trains 4 steps straight and 2 + save + load + 2, restoring the torch RNG
either from DeepSpeed's client_state (written by rank 0 only, so every rank gets rank 0's
state) or per rank (what paperscale does with its rank_XXXXX.pt files).

Restoring each rank's own RNG resumes bit for bit with either optimizer; rank 0's RNG on every
rank changes rank 1's dropout masks and so its losses after the load (by 0.004 in 3 + 3
steps). This module is also the rank program the test starts under torchrun.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ROOT, cli_env

OPTIMIZERS = ("FusedAdam", "torch.optim.Adam")
RNG_FROM = ("client_state", "per-rank file")


def build(optimizer: str) -> Any:
    import deepspeed
    import torch
    from torch import nn

    torch.manual_seed(0)  # identical initial weights on every rank and every build
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 64))
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
    }
    if optimizer == "FusedAdam":
        cfg["optimizer"] = {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.98]}}
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg
        )
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return engine


def losses(engine: Any, steps: range, rank: int) -> list[float]:
    import torch

    out = []
    for i in steps:
        x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2 * i + rank))  # (B, D)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    return out


def drift(optimizer: str, rng_from: str, work: Path, rank: int, half: int = 2) -> float:
    """Largest loss difference on this rank between 2 * `half` steps straight and `half` +
    save + load + `half`."""
    import torch

    from trainer.checkpoint.safe_load import forbid_code_in_checkpoints

    engine = build(optimizer)
    torch.manual_seed(100 + rank)  # each rank its own dropout stream, as in real training
    straight = losses(engine, range(2 * half), rank)
    engine = build(optimizer)
    torch.manual_seed(100 + rank)
    first = losses(engine, range(half), rank)
    own_rng = torch.get_rng_state()
    ckpt = work / f"{optimizer}-{rng_from}"
    engine.save_checkpoint(str(ckpt), tag="t", client_state={"rng": own_rng})
    engine = build(optimizer)
    forbid_code_in_checkpoints()  # as every load of the trainer
    _, client = engine.load_checkpoint(str(ckpt), tag="t")
    torch.set_rng_state(client["rng"] if rng_from == "client_state" else own_rng)
    resumed = first + losses(engine, range(half, 2 * half), rank)
    return max(abs(a - b) for a, b in zip(straight, resumed, strict=True))


def rank_main(work: Path) -> None:
    """Under torchrun: every case's drift on each rank, to work/drift-<rank>.json."""
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    out = {f"{o}, {r}": drift(o, r, work, rank) for o in OPTIMIZERS for r in RNG_FROM}
    (work / f"drift-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_rank_restoring_its_own_rng_resumes_exactly_and_rank_0s_drifts(
    tmp_path: Path,
) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           __file__, str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=cli_env(), capture_output=True, text=True,
                          timeout=280)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"drift-{r}.json").read_text()) for r in (0, 1))
    for optimizer in OPTIMIZERS:
        for rank in (rank0, rank1):
            assert rank[f"{optimizer}, per-rank file"] == 0.0, rank
        # rank 0's state on rank 1: rank 0's dropout masks, so other losses after the load
        assert rank1[f"{optimizer}, client_state"] > 1e-4, rank1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    rank_main(Path(sys.argv[1]))
