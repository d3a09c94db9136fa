"""Looking at runs and plans: `status`, `report` and `plan`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from launch.usage import UsageError
from trainer.run_dir import RunDir


def cmd_status(args: argparse.Namespace) -> int:
    from launch.status import format_status, run_status

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run dir {run_dir} does not exist")
    status = run_status(run_dir)
    print(json.dumps(status, indent=1) if args.json else format_status(status))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from trainer.report import write_report

    run_dir = Path(args.run_dir)
    if not RunDir(run_dir).metrics.is_file():
        raise UsageError(f"{run_dir} has no {RunDir(run_dir).metrics.name}")
    try:
        path, summary = write_report(run_dir, Path(args.out) if args.out else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(summary)
    print(f"report           {path}")
    return 0


def plan_gpu(args: argparse.Namespace, precision: str) -> tuple[str, str, float, float]:
    """(precision, how it was chosen, GiB per rank, peak FLOP/s per rank) for `plan`.

    `--gpu NAME` looks the GPU up in trainer/flops.py's table: its memory, its dense peak at
    the precision, and for `auto` the precision the trainer would pick on it. Without it, auto
    assumes a GPU with native bf16 and says so.
    """
    from launch.plan import H200_BF16_MEASURED
    from trainer.flops import GPU_SPECS, gpu_spec
    from trainer.precision import cuda_precision

    spec = None
    if args.gpu is not None:
        spec = gpu_spec(args.gpu)
        if spec is None:
            known = ", ".join(s.key for s in GPU_SPECS)
            raise UsageError(f"--gpu {args.gpu!r} is not in the table; known: {known}")
    if precision != "auto":
        how = "set in the config"
    elif spec is not None:
        choice = cuda_precision(spec.capability, spec.key)
        precision, how = choice.precision, f"auto: {choice.reason}"
    else:
        precision = "bf16"
        how = "auto, assumed: a GPU of compute capability >= 8.0 (pass --gpu NAME to check)"
    gpu_mem = args.gpu_mem if args.gpu_mem is not None else (spec.memory_gib if spec else 80.0)
    if args.peak_tflops is not None:
        peak = args.peak_tflops * 1e12
    elif spec is not None:
        peak = spec.half if precision in ("bf16", "fp16") else spec.single
    else:
        peak = H200_BF16_MEASURED
    return precision, how, gpu_mem, peak


def cmd_plan(args: argparse.Namespace) -> int:
    from launch.config import load_config
    from launch.plan import Machine, format_plan, make_plan
    from model.config import ModelConfig

    for name, value in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node)):
        if value < 1:
            raise UsageError(f"{name} must be >= 1, got {value}")
    for name, value in (
        ("--gpu-mem", args.gpu_mem),
        ("--target-tokens", args.target_tokens),
        ("--peak-tflops", args.peak_tflops),
        ("--seq-len", args.seq_len),
    ):
        if value is not None and not value > 0:
            raise UsageError(f"{name} must be > 0, got {value}")
    if not 0 < args.mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], got {args.mfu}")
    if not 0 <= args.headroom < 1:
        raise UsageError(f"--headroom must be in [0, 1), got {args.headroom}")
    if not args.write_gbs > 0:
        raise UsageError(f"--write-gbs must be > 0, got {args.write_gbs}")
    job = load_config(args.config, args.overrides)
    precision, how, gpu_mem, peak = plan_gpu(args, job.train.precision)
    vocab = job.model.vocab_size or job.data.vocab_size
    cfg = ModelConfig(**{**job.model.__dict__, "vocab_size": vocab})
    machine = Machine(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_mem_gib=gpu_mem,
        headroom=args.headroom,
        mfu=args.mfu,
        peak_flops=peak,
    )
    plan = make_plan(
        cfg,
        machine,
        target_tokens=args.target_tokens,
        max_steps=job.train.max_steps,
        precision=precision,
        checkpointing=job.train.activation_checkpointing,
        seq_len=args.seq_len,
        compiled=job.train.compile,
    )
    plan = {"vocab_size": vocab, "gpu": args.gpu, "precision_from": how, **plan}
    plan["checkpoint"] = checkpoint_figures(plan, job, machine, precision, args.write_gbs)
    print(json.dumps(plan, indent=1) if args.json else format_plan(plan))
    return 0


def checkpoint_figures(
    plan: dict[str, Any], job: Any, machine: Any, precision: str, write_gbs: float
) -> dict[str, Any]:
    """Size and save time of one checkpoint of the planned job (its recommended ZeRO stage,
    else the config's), and whether the save fits train.stop_grace_s."""
    from launch.plan_save import fits_grace, save_plan

    stage = plan["recommended_stage"]
    stage = job.train.zero_stage if stage is None else stage
    n_params = int(plan["params"]["total"])
    save = save_plan(n_params, stage, machine.world, machine.gpus_per_node, precision, write_gbs)
    return {
        "stage": stage,
        "total_gb": save.total_bytes / 1e9,
        "bytes_per_param": save.total_bytes / n_params,
        "busiest_node_gb": save.node_bytes / 1e9,
        "write_gbs": write_gbs,
        "save_s": save.seconds,
        "grace_s": job.train.stop_grace_s,
        "fits_grace": fits_grace(save.seconds, job.train.stop_grace_s),
    }
