"""How large a checkpoint is and how long saving it takes: for `plan`'s figures, and for the
lead time `submit` asks Slurm to signal before a time limit.

What DeepSpeed 0.19 writes (measured: the base model, bf16, ZeRO 2 on 2 ranks, 14.0 bytes per
parameter): the module's weights in the training precision once, by rank 0 (ZeRO 0-2; at
ZeRO 3 every rank writes its partition), and each rank its partition of the optimizer state
(fp32 master weights and Adam's two moments, 12 bytes per parameter; at ZeRO 0 rank 0 holds
all of it). The ranks write at the same time, so the save takes as long as the node that
writes the most (the first: rank 0's weights are there) at the write rate assumed per node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_WRITE_GBS = 1.0  # GB/s a node writes to the checkpoint file system (assumed)
EXIT_MARGIN_S = 5.0  # trainer/loop.py keeps this much of the grace period for leaving


@dataclass(frozen=True)
class SavePlan:
    total_bytes: float  # all ranks together
    node_bytes: float  # the node that writes the most
    seconds: float  # node_bytes at the assumed write rate
    write_gbs: float


def weight_bytes(precision: str) -> int:
    """Bytes per parameter of the module's weights in the training precision."""
    return 4 if precision == "fp32" else 2


def save_plan(
    n_params: int,
    stage: int,
    world: int,
    ranks_per_node: int,
    precision: str,
    write_gbs: float = DEFAULT_WRITE_GBS,
) -> SavePlan:
    """Bytes of one checkpoint and seconds to write it (see the module docstring)."""
    weights = weight_bytes(precision) * n_params
    optimizer = 12 * n_params if precision != "fp32" or stage > 0 else 8 * n_params
    if stage == 0:  # rank 0 writes everything
        node = weights + optimizer
    elif stage == 3:  # every rank its partition of both
        node = (weights + optimizer) * min(ranks_per_node, world) / world
    else:  # rank 0 the weights, every rank its optimizer partition
        node = weights + optimizer * min(ranks_per_node, world) / world
    total = weights + optimizer
    return SavePlan(total, node, node / (write_gbs * 1e9), write_gbs)


def fits_grace(save_s: float, grace_s: float) -> bool:
    """Whether a save of `save_s` seconds fits a stop signal's grace period."""
    return save_s + EXIT_MARGIN_S <= grace_s


def signal_lead_seconds(save_s: float, profile_seconds: int) -> int:
    """Seconds before the time limit to signal USR1: the profile's, or more when a save is
    long (three saves' worth, a step in flight and leaving, plus half a minute to spare)."""
    return max(profile_seconds, math.ceil(3 * save_s + EXIT_MARGIN_S + 30))


def checkpoint_lines(c: dict | None) -> list[str]:
    """The checkpoint's size and save time (this module), and the grace-period check."""
    if not c:
        return []
    lines = [
        f"checkpoint       {c['total_gb']:.2f} GB at ZeRO {c['stage']} "
        f"({c['bytes_per_param']:.1f} bytes per parameter), {c['busiest_node_gb']:.2f} GB from "
        f"the busiest node: save ~{c['save_s']:.1f} s at {c['write_gbs']:g} GB/s per node "
        "(assumed; --write-gbs)",
    ]
    if c["fits_grace"]:
        lines.append(f"stop grace       the save fits train.stop_grace_s={c['grace_s']:g} s")
    else:
        lines.append(
            f"warning: a save of ~{c['save_s']:.0f} s does not fit train.stop_grace_s="
            f"{c['grace_s']:g} s (5 s of it kept for leaving): on preemption the run would be "
            "killed before its checkpoint is complete; raise train.stop_grace_s and Slurm's "
            "KillWait/GraceTime, or write checkpoints to a faster file system"
        )
    return lines
