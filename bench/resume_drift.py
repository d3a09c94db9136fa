"""Where a plain DeepSpeed save/load resume drifts: the optimizer or the RNG restore?

Runs under torchrun (2 CPU ranks, gloo, ZeRO 2, fp32, dropout 0.1). For DeepSpeed's FusedAdam
(its `step` is a Python int) and torch.optim.Adam (a tensor `step`), it trains 6 steps straight
and 3 + save + load + 3, restoring the torch RNG either from DeepSpeed's client_state (written
by rank 0 only, so every rank gets rank 0's state) or per rank (what paperscale does with its
rank_XXXXX.pt files), and prints the largest per-step loss difference on each rank.

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 \
        -m bench.resume_drift --dir /tmp/resume_drift

`--smoke` trains 2 + 2 steps instead of 3 + 3 (the drift shows from the first step after the
load); `--json PATH` writes the four largest differences as rows for bench/suite.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from torch import nn

from bench.common import add_output_arguments, row, write_rows
from trainer.checkpoint.safe_load import forbid_code_in_checkpoints


def build(optimizer: str) -> Any:
    torch.manual_seed(0)  # identical initial weights on every rank and every build
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 64))
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
    }
    adam = {"lr": 1e-3, "betas": [0.9, 0.98], "eps": 1e-9}
    if optimizer == "FusedAdam":
        cfg["optimizer"] = {"type": "Adam", "params": adam}
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg
        )
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return engine


def run(engine: Any, steps: range, rank: int) -> list[float]:
    out = []
    for i in steps:
        x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2 * i + rank))  # (B, D)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    return out


def drift(optimizer: str, rng_from: str, work: Path, rank: int, half: int = 3) -> float:
    """Largest loss difference between 2 * `half` steps straight and `half` + save + load +
    `half`, on this rank."""
    engine = build(optimizer)
    torch.manual_seed(100 + rank)  # each rank its own dropout stream, as in real training
    straight = run(engine, range(2 * half), rank)
    engine = build(optimizer)
    torch.manual_seed(100 + rank)
    first = run(engine, range(half), rank)
    own_rng = torch.get_rng_state()
    ckpt = work / f"{optimizer}-{rng_from}"
    engine.save_checkpoint(str(ckpt), tag="t", client_state={"rng": own_rng})
    engine = build(optimizer)
    forbid_code_in_checkpoints()  # as every load of the trainer
    _, client = engine.load_checkpoint(str(ckpt), tag="t")
    torch.set_rng_state(client["rng"] if rng_from == "client_state" else own_rng)
    resumed = first + run(engine, range(half, 2 * half), rank)
    return max(abs(a - b) for a, b in zip(straight, resumed, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/resume_drift"))
    add_output_arguments(parser, "2 + 2 steps instead of 3 + 3")
    args = parser.parse_args()
    half = 2 if args.smoke else 3
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    rows = []
    for optimizer in ("FusedAdam", "torch.optim.Adam"):
        for rng_from in ("client_state", "per-rank file"):
            diff = torch.tensor(
                [drift(optimizer, rng_from, args.dir, rank, half)], dtype=torch.float64
            )
            dist.all_reduce(diff, op=dist.ReduceOp.MAX)
            rows.append((optimizer, rng_from, diff.item()))
    if rank == 0:
        print(f"\n{'optimizer':<18} {'RNG restored from':<18} max |loss diff| (any rank)")
        for optimizer, rng_from, diff in rows:
            print(f"{optimizer:<18} {rng_from:<18} {diff:.3g}")
        shutil.rmtree(args.dir, ignore_errors=True)
        write_rows(
            args.json,
            [
                row(
                    f"max |loss diff|, {optimizer}, RNG from {rng_from}",
                    diff,
                    "loss",
                    optimizer=optimizer,
                    rng_from=rng_from,
                    steps=f"{half} + {half}",
                )
                for optimizer, rng_from, diff in rows
            ],
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main()
