"""Seconds of one optimizer step, for `paperscale plan`: the matmuls at the planned speed, the
overheads (launch/cost_model/speed.py) and the gradients' synchronisation
(launch/cost_model/comm.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launch.cost_model.comm import sync_seconds, volume_units
from model.config import ModelConfig
from model.params import count_parameters
from trainer.flops import step_flops

if TYPE_CHECKING:
    from launch.cost_model.plan import Machine


def step_time(
    cfg: ModelConfig,
    machine: Machine,
    tokens: int,
    seq_len: int,
    checkpointing: bool = False,
    fill: float = 1.0,
    accum: int = 1,
    stage: int = 1,
) -> dict[str, Any]:
    """FLOPs and seconds of one optimizer step of `tokens` padded tokens per side (all ranks)
    in `accum` micro-batches per rank at ZeRO `stage`.

    step_s = FLOPs of the tokens the micro-batches hold (`fill` of their budget) / (ranks x
    peak x MFU) + the overhead per step + accum x the overhead per micro-batch
    (launch/cost_model/speed.py) + the gradients' synchronisation (launch/cost_model/comm.py)
    that does not overlap the backward (`exposed_sync`).
    """
    flops = step_flops(cfg, tokens, tokens, seq_len, seq_len)
    if checkpointing:
        flops *= 4 / 3  # the forward pass runs twice
    compute_s = fill * flops / (machine.world * machine.peak_flops * machine.mfu)
    overhead_s = machine.overhead_s + accum * machine.overhead_micro_s
    comm_s, comm_bytes, comm_link = 0.0, 0.0, ""
    if machine.links is not None and not machine.on_cpu:
        n_params = count_parameters(cfg)["total"]
        sync = sync_seconds(n_params, machine.comm_bytes, stage, accum, machine.nodes,
                            machine.gpus_per_node, machine.links)  # fmt: skip
        comm_s, comm_bytes = float(sync["seconds"]), float(sync["bytes"])
        comm_link = str(sync["link"]) if comm_s else ""
        comm_s = exposed_sync(comm_s, compute_s, stage, accum, n_params, machine.buckets)
    return {
        "flops": flops,
        "compute_s": compute_s,
        "overhead_s": overhead_s,
        "comm_s": comm_s,
        "comm_bytes": comm_bytes,
        "comm_link": comm_link,
        "step_s": compute_s + overhead_s + comm_s,
    }


BACKWARD_SHARE = 2 / 3  # of a micro-batch's matmuls: the backward's (twice the forward's)


def exposed_sync(
    comm_s: float, compute_s: float, stage: int, accum: int, n_params: int, buckets: Any
) -> float:
    """The synchronisation seconds left after what overlap_comm hides behind the backward.

    ZeRO 0, 1 and 2 reduce their gradients bucket by bucket while the backward runs (ZeRO 0 and
    1 in the step's last backward, ZeRO 2 in each): each reduction is hidden up to that
    backward's time, except its last bucket, which can only start when the backward ends.
    ZeRO 0's all-reduce is all reduction; at ZeRO 1 and 2 the parameters' all-gather after the
    update is not hidden, nor is anything at ZeRO 3 (planned without overlap). A model, not a
    measurement."""
    if buckets is None or not buckets.overlap or stage == 3:
        return comm_s
    units = volume_units(stage, accum)
    reduce_s = comm_s if stage == 0 else comm_s * (units - 1) / units
    events = accum if stage == 2 else 1
    per_event, backward_s = reduce_s / events, BACKWARD_SHARE * compute_s / accum
    last_bucket = per_event * min(1.0, buckets.reduce / max(n_params, 1))
    return comm_s - reduce_s + events * max(per_event - backward_s, last_bucket)
