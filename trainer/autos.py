"""Every `auto` of a run, resolved in one place, stated in one line each, and kept with the run.

- `train.device`: cuda where torch sees a CUDA device, else cpu (trainer/dist.py).
- `train.precision`: trainer/precision.py's rule, from the GPU's compute capability, or the CPU's
  flags and a matmul measured once per machine and kept in the machine cache.
- `train.attention`: trainer/kernels.py's rule, from the device and the precision.
- `train.compile`: `layers` on a GPU, `false` on a CPU (compile_choice), from the device.
- `train.grad_accum_dtype`: fp32 under bf16 where a step sums several micro-batches at ZeRO 1-3,
  else the precision's (trainer/config.py accumulation_choice), from the config and the
  precision.
- `data.num_workers`: 1 on a CPU; on a GPU one per spare core of each rank, at most 2
  (data_pipeline/config.py's workers_for), from the device, the cores and the ranks per node.
  It deals the data (a worker is a slot of the order), so it is kept even where the run moves.

The first start of a run writes what it decided, with the reasons, to RUN/decisions.json. Every
later start of that run (a restart in place, a Slurm requeue, a resume, a new `train` or
`submit` into the same run dir, before or after the first checkpoint) takes the recorded values
and says, in its one line, where this machine alone would pick otherwise. So a run never
changes precision or kernel halfway because the machine it continues on is another one, or
because a measurement read otherwise. The device is a fact of the machine and is not kept: a run
may move from CPUs to GPUs, and then the device's own choices (the attention kernel) are made
afresh and said so; the precision stays (its checkpoint is in it).

A value set in the config is taken as given (a resumed run's checkpoint still fixes the
precision: launch/preflight.py refuses another one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from data_pipeline.config import host_workers
from trainer.config import accumulation_choice, accumulation_problem, compile_scope
from trainer.precision import PrecisionChoice, machine_choice, resolve_precision, runs_on

RECORD_VERSION = 1
KEPT = "as the run's first start decided"


class DecisionError(ValueError):
    """A recorded or saved decision cannot hold on this machine (e.g. fp16 without a GPU)."""


@dataclass(frozen=True)
class Decision:
    """What a key was asked to be, what it is, and why, in a few words."""

    requested: str
    value: str
    reason: str

    def line(self, name: str) -> str:
        return f"{name} {self.requested} -> {self.value}: {self.reason}"


@dataclass(frozen=True)
class Record:
    """RUN/decisions.json: the device it was decided on, and one Decision per key."""

    device: str
    decisions: dict[str, Decision]


def read_record(path: Path) -> Record | None:
    """The run's recorded decisions; None before its first start. A damaged file is a
    DecisionError naming it (it is never silently replaced by new decisions)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        decisions = {k: Decision(**v) for k, v in data["decisions"].items()}
        return Record(str(data["device"]), decisions)
    except (ValueError, KeyError, TypeError) as exc:
        raise DecisionError(
            f"{path} is not a record of decisions ({exc}); restore it or delete it to decide anew"
        ) from None


def write_record(path: Path, record: Record, machine: str) -> None:
    from trainer.run_dir import write_atomic

    data = {
        "version": RECORD_VERSION,
        "device": record.device,
        "machine": machine,
        "decisions": {k: asdict(v) for k, v in record.decisions.items()},
    }
    write_atomic(path, json.dumps(data, indent=1) + "\n")


def keep_or_decide(
    requested: str, recorded: Decision | None, fresh: Callable[[], tuple[str, str]]
) -> Decision:
    """One key: the config's value when it sets one; else the recorded `auto` decision (with
    this machine's own pick named when it differs); else `fresh()`'s (value, reason).

    A config that names the recorded value is the run's own config.yaml (a restart in place, a
    requeue), which holds the resolved values: that is still the kept `auto` decision."""
    kept = recorded is not None and recorded.requested == "auto"
    if requested != "auto" and not (kept and recorded is not None and requested == recorded.value):
        return Decision(requested, requested, "set in the config")
    if not kept or recorded is None:
        value, reason = fresh()
        return Decision("auto", value, reason)
    value, reason = fresh()
    if value == recorded.value:
        return Decision("auto", recorded.value, f"{recorded.reason} ({KEPT})")
    return Decision(
        "auto",
        recorded.value,
        f"{KEPT} ({recorded.reason}); this machine alone would pick {value}: {reason}",
    )


def decide_precision(
    requested: str,
    recorded: Decision | None,
    saved: str | None,
    device_type: str,
    d_model: int,
    d_ff: int,
    choose: Callable[[], PrecisionChoice] | None = None,
) -> Decision:
    """`train.precision`: the record first, then the checkpoint's (a run dir from before
    decisions were recorded), then the machine's rule."""
    pick = choose or (lambda: machine_choice(device_type, d_model, d_ff))
    if recorded is None or recorded.requested != "auto":
        try:
            choice = resolve_precision(requested, device_type, d_model, d_ff, saved, pick)
        except ValueError as exc:
            raise DecisionError(str(exc)) from None
        return Decision(requested, choice.precision, choice.reason)

    def fresh() -> tuple[str, str]:
        choice = pick()
        return choice.precision, choice.reason

    decision = keep_or_decide(requested, recorded, fresh)
    if not runs_on(decision.value, device_type):
        raise DecisionError(
            f"the run trains in {decision.value} ({decision.reason}), which needs a GPU; this "
            "machine has none (continue it where there is one)"
        )
    return decision


def decide_attention(
    requested: str, recorded: Decision | None, device_type: str, precision: str
) -> Decision:
    """`train.attention` for the device and precision; kept while the device type is the one
    it was decided on (the caller passes no record otherwise)."""

    def fresh() -> tuple[str, str]:
        from trainer.kernels import resolve_attention  # imports torch: `status` reads records only

        choice = resolve_attention("auto", device_type, precision)
        return choice.name, choice.reason

    return keep_or_decide(requested, recorded, fresh)


def compile_choice(device_type: str) -> tuple[str, str]:
    """`train.compile: auto`: each layer compiled as a region on a GPU, where an eager step is
    bound by kernel launches and memory traffic between small kernels; nothing on a CPU, where
    a first compile costs each rank minutes of CPU and no bench of ours has measured it pay."""
    if device_type == "cuda":
        return "layers", "a GPU: each encoder and decoder layer compiled as a region, one graph"
    return (
        "false",
        "a CPU: compiling costs each rank minutes at its first step, not measured to pay",
    )


def decide_compile(requested: str, recorded: Decision | None, device_type: str) -> Decision:
    """`train.compile` for the device; kept while the device type is the one it was decided on
    (the caller passes no record otherwise)."""
    return keep_or_decide(compile_scope(requested), recorded, lambda: compile_choice(device_type))


def decide_workers(
    requested: str, recorded: Decision | None, pick: Callable[[], tuple[int, str]]
) -> Decision:
    """`data.num_workers`: the record's, else `pick()`'s (workers_for on this host)."""

    def fresh() -> tuple[str, str]:
        n, reason = pick()
        return str(n), reason

    return keep_or_decide(requested, recorded, fresh)


def decide_accumulation(
    train: Mapping[str, Any], recorded: Decision | None, began: bool, precision: str
) -> Decision:
    """`train.grad_accum_dtype`; a run whose record predates the key keeps what it began with
    (its precision's dtype: its optimizer's checkpoint is in that form)."""
    requested = str(train.get("grad_accum_dtype", "auto"))
    accum, stage = int(train.get("grad_accum", 1)), int(train.get("zero_stage", 0))
    if requested == "auto" and began and recorded is None:
        return Decision("auto", precision, "as the run began (before this was decided)")
    if recorded is not None and accumulation_problem(recorded.value, precision, stage):
        recorded = None  # decided for a precision the run no longer has: decided afresh
    decision = keep_or_decide(
        requested, recorded, lambda: accumulation_choice(precision, accum, stage)
    )
    problem = accumulation_problem(decision.value, precision, stage)
    if problem:
        raise DecisionError(f"train.grad_accum_dtype={decision.value}: {problem}")
    return decision


def resolve_all(
    train: Mapping[str, Any],
    device_type: str,
    d_model: int,
    d_ff: int,
    record: Record | None,
    saved_precision: str | None,
    choose_precision: Callable[[], PrecisionChoice] | None = None,
    workers: str = "1",
    pick_workers: Callable[[], tuple[int, str]] | None = None,
) -> Record:
    """Every decision of a start, from the config's `train` values, the run's record and the
    checkpoint's precision. Raises DecisionError when the run cannot continue here."""
    recorded = record.decisions if record else {}
    device_reason = "torch sees a CUDA device" if device_type == "cuda" else "no CUDA device"
    device = Decision(
        str(train["device"]),
        device_type,
        device_reason if train["device"] == "auto" else "set in the config",
    )
    precision = decide_precision(
        str(train["precision"]), recorded.get("precision"), saved_precision, device_type,
        d_model, d_ff, choose_precision,
    )  # fmt: skip
    same_device = record is not None and record.device == device_type
    attention = decide_attention(
        str(train["attention"]),
        recorded.get("attention") if same_device else None,
        device_type,
        precision.value,
    )
    compiled = decide_compile(
        str(train.get("compile", "auto")),
        recorded.get("compile") if same_device else None,
        device_type,
    )
    if record is not None and not same_device:
        moved = f"(decided afresh: the run moved from {record.device} to {device_type})"
        if train["attention"] == "auto":
            attention = Decision("auto", attention.value, f"{attention.reason} {moved}")
        if compiled.requested == "auto":
            compiled = Decision("auto", compiled.value, f"{compiled.reason} {moved}")
    decisions = {"device": device, "precision": precision, "attention": attention}
    decisions["grad_accum_dtype"] = decide_accumulation(
        train, recorded.get("grad_accum_dtype"),
        record is not None or saved_precision is not None, precision.value,
    )  # fmt: skip
    pick = pick_workers or (lambda: host_workers(device_type))
    num_workers = decide_workers(str(workers), recorded.get("num_workers"), pick)
    return Record(device_type, {**decisions, "compile": compiled, "num_workers": num_workers})


def lines(record: Record) -> list[str]:
    """The start's lines: one per key that was `auto` (set values need no explanation)."""
    return [d.line(k) for k, d in record.decisions.items() if d.requested == "auto"]


DATA_KEYS = ("num_workers",)  # decisions of `data.<key>`; the others are `train.<key>`


def values(record: Record) -> dict[str, str]:
    """The `train.<key>` values the run trains with (the device is the DistEnv's)."""
    skip = ("device", *DATA_KEYS)
    return {k: d.value for k, d in record.decisions.items() if k not in skip}


def data_values(record: Record) -> dict[str, int]:
    """The `data.<key>` values the run trains with (a record from before one was decided
    has none: the config's value stands)."""
    return {k: int(d.value) for k, d in record.decisions.items() if k in DATA_KEYS}
