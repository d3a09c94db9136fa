"""Rank, world size and device, read from the environment torchrun (or srun + torchrun) sets."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(choice: str) -> torch.device:
    """`auto` picks CUDA when present; the CPU path runs DeepSpeed's CPU accelerator."""
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_distributed(device_choice: str, timeout_s: float = 600.0) -> DistEnv:
    """Start the process group (nccl on GPU, gloo on CPU) through DeepSpeed.

    Works the same whether the process was started by torchrun or as a single plain process
    (then a world of one on a free local port).
    """
    device = resolve_device(device_choice)
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "RANK" not in os.environ:
        os.environ.update(
            {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
        )
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    import deepspeed  # imported late: DS_ACCELERATOR must be set first

    from trainer.ds.ops import op_locks, remember_cpu_info, wait_for_build_locks

    remember_cpu_info()
    wait_for_build_locks(op_locks(), lambda line: print(f"paperscale: {line}", file=sys.stderr))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    later_groups_time_out_after(timeout_s)
    deepspeed.init_distributed(
        dist_backend="nccl" if device.type == "cuda" else "gloo",
        timeout=timedelta(seconds=timeout_s),
    )
    return DistEnv(
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        device=device,
    )


def later_groups_time_out_after(timeout_s: float) -> None:
    """Every process group made later without a timeout of its own (DeepSpeed's data-parallel
    and ZeRO groups, the host-side gloo group) times out after `timeout_s` too, not torch's
    default (30 min for gloo, 10 min for NCCL): a rank that never joins one fails the job
    within train.dist_timeout_s, as the world's group does. torch reads the default from these
    module attributes each time a group is made (distributed_c10d._get_default_timeout)."""
    from torch.distributed import distributed_c10d as c10d

    c10d.default_pg_timeout = timedelta(seconds=timeout_s)
    c10d.default_pg_nccl_timeout = timedelta(seconds=timeout_s)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broadcast_str(value: str) -> str:
    """Rank 0's value on every rank (the wandb id of a fresh run is drawn on each rank)."""
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return str(box[0])
