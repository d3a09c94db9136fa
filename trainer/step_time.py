"""Where a training step's time went: every profiled op put in one group, by name and by the
region of the step it ran in.

Groups, in the order of the table: matmul (the linear layers and the output projection),
attention (everything inside an SDPA call), norm/dropout/elementwise (every other op of the
forward and backward passes: layer norms, dropout, residual adds, casts and copies), loss (the
label-smoothed loss's own work besides its matmuls), optimizer (Adam and DeepSpeed's work in
`engine.step`), communication (collectives), data wait (waiting for the next batch) and
host/other (the rest of the step's wall time: Python, the autograd engine's bookkeeping,
DeepSpeed's hooks, gaps between ops; on a GPU, the time the device is idle).

On a CPU an op's time is its own CPU time (without its children's); on a GPU it is the device
time of the kernels it launched. The trainer marks the regions with `torch.profiler.
record_function` (names `REGIONS`); the model marks its loss.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from model.loss import PROFILE_REGION

MATMUL = "matmul"
ATTENTION = "attention"
ELEMENTWISE = "norm/dropout/elementwise"
LOSS = "loss"
OPTIMIZER = "optimizer"
COMMUNICATION = "communication"
DATA_WAIT = "data wait"
HOST = "host/other"
GROUPS = (MATMUL, ATTENTION, ELEMENTWISE, LOSS, OPTIMIZER, COMMUNICATION, DATA_WAIT, HOST)

# record_function names of the step's regions (trainer/step.py, trainer/loop.py, model/loss.py)
REGION_DATA = "paperscale.data"
REGION_FORWARD = "paperscale.forward"
REGION_BACKWARD = "paperscale.backward"
REGION_OPTIMIZER = "paperscale.optimizer"
REGION_LOSS = PROFILE_REGION
REGIONS = (REGION_DATA, REGION_FORWARD, REGION_BACKWARD, REGION_OPTIMIZER, REGION_LOSS)

_MATMUL_OP = re.compile(
    r"^aten::(mm|bmm|addmm|_addmm_activation|baddbmm|addbmm|matmul|linear|mv|addmv|dot|"
    r"_mkldnn_\w+|mkldnn_\w*linear\w*)$"
)
_ATTENTION_OP = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_att")
_COMM_OP = re.compile(
    r"c10d::|nccl|gloo|all_reduce|allreduce|reduce_scatter|all_gather|allgather|broadcast|"
    r"record_param_comms|barrier",
    re.IGNORECASE,
)
_DEVICE_MATMUL = re.compile(r"gemm|cutlass|xmma|matmul|sm\d+_\w*mma", re.IGNORECASE)


@dataclass(frozen=True)
class OpTime:
    """One profiled op: its name, its own time in microseconds and the names of the ops and
    regions it ran inside (outermost first)."""

    name: str
    self_us: float
    ancestors: tuple[str, ...] = ()


def group_of(op: OpTime) -> str:
    """The group an op's own time belongs to."""
    inside = set(op.ancestors)
    if _COMM_OP.search(op.name):
        return COMMUNICATION
    if REGION_DATA in inside or op.name == REGION_DATA:
        return DATA_WAIT
    if REGION_OPTIMIZER in inside:
        return OPTIMIZER
    if _ATTENTION_OP.search(op.name) or any(_ATTENTION_OP.search(a) for a in op.ancestors):
        return ATTENTION
    if _MATMUL_OP.match(op.name) or _DEVICE_MATMUL.search(op.name):
        return MATMUL
    if REGION_LOSS in inside:
        return LOSS
    if op.name.startswith("aten::"):
        return ELEMENTWISE
    return HOST


@dataclass
class StepTimes:
    """Milliseconds per step by group over `steps` profiled steps of one rank, and the ops that
    took the most time in each group."""

    steps: int
    step_ms: float  # wall time per step
    groups: dict[str, float] = field(default_factory=dict)  # ms per step, GROUPS order
    top_ops: dict[str, list[tuple[str, float]]] = field(default_factory=dict)

    def share(self, group: str) -> float:
        return self.groups.get(group, 0.0) / self.step_ms if self.step_ms > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "step_ms": self.step_ms,
            "groups_ms": self.groups,
            "top_ops_ms": {g: [list(x) for x in ops] for g, ops in self.top_ops.items()},
        }


def step_times(ops: Iterable[OpTime], steps: int, wall_us: float, top: int = 5) -> StepTimes:
    """Group the ops of `steps` steps that took `wall_us` of wall time in all. Host/other is
    what the other groups leave of the wall time (never below zero)."""
    totals = dict.fromkeys(GROUPS, 0.0)
    by_op: dict[str, dict[str, float]] = {g: {} for g in GROUPS}
    for op in ops:
        group = group_of(op)
        if group == HOST:
            continue  # the remainder below counts it, with the gaps between ops
        totals[group] += op.self_us
        by_op[group][op.name] = by_op[group].get(op.name, 0.0) + op.self_us
    n = max(steps, 1)
    totals[HOST] = max(wall_us - sum(totals.values()), 0.0)
    groups = {g: totals[g] / n / 1000.0 for g in GROUPS}
    top_ops = {
        g: [(name, us / n / 1000.0) for name, us in sorted(ops.items(), key=lambda x: -x[1])[:top]]
        for g, ops in by_op.items()
        if ops
    }
    return StepTimes(steps, wall_us / n / 1000.0, groups, top_ops)


def format_table(per_rank: Sequence[StepTimes], title: str) -> str:
    """The grouped table: ms per step on each rank, the mean share, and the top ops."""
    ranks = range(len(per_rank))
    head = f"{'group':<26}" + "".join(f"{'rank ' + str(r):>11}" for r in ranks) + f"{'share':>9}"
    lines = [title, head, "-" * len(head)]
    for group in GROUPS:
        values = [t.groups.get(group, 0.0) for t in per_rank]
        share = sum(t.share(group) for t in per_rank) / max(len(per_rank), 1)
        cells = "".join(f"{v:>8.1f} ms" for v in values)
        lines.append(f"{group:<26}{cells}{100 * share:>8.1f}%")
    total = "".join(f"{t.step_ms:>8.1f} ms" for t in per_rank)
    lines.append(f"{'step (wall)':<26}{total}{100.0:>8.1f}%")
    first = per_rank[0] if per_rank else None
    if first is not None:
        lines.append("")
        lines.append("top ops of rank 0, ms per step:")
        for group in GROUPS:
            ops = first.top_ops.get(group)
            if ops:
                shown = ", ".join(f"{name} {ms:.1f}" for name, ms in ops)
                lines.append(f"  {group}: {shown}")
    return "\n".join(lines)
