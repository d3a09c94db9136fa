"""`paperscale plan`: the arguments checked, the device's speed (measured or assumed), the plan
made (launch/cost_model/plan.py) and printed (launch/cost_model/table.py) with the config's own
batch, what the run spends beside its steps (launch/cost_model/run_time.py), the time to a BLEU
(launch/cost_model/quality.py) and the checkpoint's size (launch/cost_model/save.py)."""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING, Any

from launch.usage import UsageError

if TYPE_CHECKING:  # imported where used: `plan --help` stays quick
    from launch.cost_model.speed import Calibration, Speed


def _check_args(args: argparse.Namespace) -> None:
    """Every numeric argument in range, or a UsageError naming it."""
    for name, value in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node)):
        if value < 1:
            raise UsageError(f"{name} must be >= 1, got {value}")
    for name, value in (
        ("--gpu-mem", args.gpu_mem),
        ("--peak-tflops", args.peak_tflops),
        ("--seq-len", args.seq_len),
        ("--write-gbs", args.write_gbs),
        ("--network-gbps", args.network_gbps),
    ):
        if value is not None and not value > 0:
            raise UsageError(f"{name} must be > 0, got {value}")
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], got {args.mfu}")
    if not 0 < args.fill <= 1:
        raise UsageError(f"--fill must be in (0, 1], got {args.fill}")
    if not 0 <= args.headroom < 1:
        raise UsageError(f"--headroom must be in [0, 1), got {args.headroom}")
    if not 0 <= args.batch_tolerance < 1:
        raise UsageError(f"--batch-tolerance must be in [0, 1), got {args.batch_tolerance}")
    if args.overhead_ms is not None and not args.overhead_ms >= 0:
        raise UsageError(f"--overhead-ms must be >= 0, got {args.overhead_ms}")


def target_tokens(value: str, job: Any, world: int) -> tuple[int, str]:
    """--target-tokens: a number, or `config` for data.max_tokens x train.grad_accum x ranks;
    with where it came from, for the printout."""
    if value == "config":
        tokens = job.data.max_tokens * job.train.grad_accum * world
        how = f"config: {job.data.max_tokens:,} x {job.train.grad_accum} x {world} ranks"
        return tokens, how
    try:
        tokens = int(value)
    except ValueError:
        raise UsageError(f"--target-tokens must be a number or 'config', got {value!r}") from None
    if tokens < 1:
        raise UsageError(f"--target-tokens must be > 0, got {tokens}")
    return tokens, ""


def plan_gpu(args: argparse.Namespace, precision: str) -> tuple[str, str, float, float]:
    """(precision, how it was chosen, GiB per rank, peak FLOP/s per rank) for `plan`.

    `--gpu NAME` looks the GPU up in trainer/flops.py's table: its memory, its dense peak at
    the precision, and for `auto` the precision the trainer would pick on it. Without it, auto
    assumes a GPU with native bf16 and says so.
    """
    from launch.cost_model.plan import H200_BF16_MEASURED
    from trainer.flops import gpu_spec
    from trainer.precision import cuda_precision

    spec = gpu_spec(args.gpu) if args.gpu is not None else None
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


def read_calibration(args: argparse.Namespace) -> Calibration | None:
    """--calibration's file, or a UsageError naming what is wrong with it."""
    from launch.cost_model.speed import load_calibration

    try:
        return load_calibration(args.calibration) if args.calibration else None
    except ValueError as exc:
        raise UsageError(f"--calibration {exc}") from None


def device_speed(
    args: argparse.Namespace, job: Any, model: dict[str, int], cal: Calibration | None
) -> tuple[Speed, str, str, float, Calibration | None]:
    """(speed, precision, how, GiB per rank, the calibration where it applies) of the planned
    device: the calibration's where it measured that device (and precision), else the table's
    peak x MFU and an assumed overhead."""
    from launch.cost_model.speed import (
        ASSUMED_MFU,
        ASSUMED_OVERHEAD_S,
        MEASURED_GPUS,
        assumed_speed,
        calibration_applies,
        gpu_measured_speed,
        measured_speed,
        scaled_gpu_speed,
    )
    from trainer.flops import GPU_SPECS, gpu_spec

    spec = gpu_spec(args.gpu) if args.gpu is not None else None
    if args.gpu is not None and spec is None:
        known = ", ".join(s.key for s in GPU_SPECS)
        raise UsageError(f"--gpu {args.gpu!r} is not in the table; known: {known}")
    why = calibration_applies(cal, spec.key if spec else None, job.train.precision) if cal else ""
    if cal is not None and not why:
        gpu_mem = args.gpu_mem if args.gpu_mem is not None else calibrated_memory(cal, args)
        how = (
            f"auto, as the calibration settled it on {cal.device_name}"
            if job.train.precision == "auto"
            else "set in the config"
        )
        speed = measured_speed(cal, model, args.gpus_per_node)
        return speed, cal.precision, how, gpu_mem, cal
    precision, how, gpu_mem, peak = plan_gpu(args, job.train.precision)
    compiled = whole_model_compiled(job)
    untold = args.mfu is None and args.overhead_ms is None
    if spec is not None and precision == "bf16" and untold:
        measured = MEASURED_GPUS.get(spec.key)
        if measured:
            speed = gpu_measured_speed(spec.key, peak, measured, compiled, why)
            return speed, precision, how, gpu_mem, None
        ref = min(MEASURED_GPUS, key=lambda k: abs(math.log(gpu_spec(k).half / peak)))
        ref_peak = gpu_spec(ref).half
        speed = scaled_gpu_speed(spec.key, peak, ref, ref_peak, MEASURED_GPUS[ref], compiled, why)
        return speed, precision, how, gpu_mem, None
    overhead = ASSUMED_OVERHEAD_S if args.overhead_ms is None else args.overhead_ms / 1e3
    mfu = ASSUMED_MFU if args.mfu is None else args.mfu
    name = spec.key if spec else "GPU (no --gpu)"
    return assumed_speed(name, peak, mfu, overhead, why), precision, how, gpu_mem, None


def whole_model_compiled(job: Any) -> bool:
    """`train.compile: model` (or true): the figures measured compiled apply, and the loss is
    the compiler's fused one. `layers` (what `auto` picks on a GPU) is planned from the eager
    figures, none of ours having measured it yet, with the eager chunked loss."""
    from trainer.config import compile_scope

    return compile_scope(job.train.compile) == "model"


def calibrated_memory(cal: Calibration, args: argparse.Namespace) -> float:
    """GiB per rank on the calibrated machine: its GPU's memory, or its host memory shared by
    the node's ranks on a CPU; 80 when the file does not say."""
    if cal.memory_gib is None:
        return 80.0
    return cal.memory_gib / (args.gpus_per_node if cal.device == "cpu" else 1)


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the plan of `args.config` on the machine the arguments describe (or its JSON)."""
    from launch.config import load_config
    from launch.cost_model.comm import Interconnect
    from launch.cost_model.feed import feed_figures
    from launch.cost_model.plan import Machine, ds_buckets, make_plan
    from launch.cost_model.table import format_plan
    from model.config import ModelConfig

    _check_args(args)
    job = load_config(args.config, args.overrides)
    vocab = job.model.vocab_size or job.data.vocab_size
    cfg = ModelConfig(**{**job.model.__dict__, "vocab_size": vocab})
    shape = {"d_model": cfg.d_model, "d_ff": cfg.d_ff, "vocab_size": vocab}
    speed, precision, how, gpu_mem, cal = device_speed(args, job, shape, read_calibration(args))
    machine = Machine(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_mem_gib=gpu_mem,
        headroom=args.headroom,
        mfu=speed.mfu,
        peak_flops=speed.peak_flops,
        overhead_s=speed.overhead_s,
        overhead_micro_s=speed.overhead_micro_s,
        on_cpu=speed.device == "cpu",
        links=Interconnect.of(args.intra_link, args.network, args.network_gbps),
        comm_bytes=4 if precision == "fp32" else 2,
        buckets=ds_buckets(job.train),
    )
    target, target_from = target_tokens(args.target_tokens, job, machine.world)
    plan = make_plan(
        cfg,
        machine,
        target_tokens=target,
        max_steps=job.train.max_steps,
        precision=precision,
        checkpointing=job.train.activation_checkpointing,
        seq_len=args.seq_len,
        compiled=whole_model_compiled(job),
        tolerance=args.batch_tolerance,
        fill=args.fill,
        sums=job.train.grad_accum_dtype,
    )
    plan = {"vocab_size": vocab, "gpu": args.gpu, "precision_from": how, **plan}
    plan.update(target_from=target_from, speed_line=speed.line, speed_measured=speed.measured)
    plan["overlap_comm"] = job.train.overlap_comm
    plan["checkpoint"] = checkpoint_figures(plan, job, machine, precision, args.write_gbs)
    if plan["recommended_stage"] is not None:
        plan["configured"] = c = configured_batch(cfg, job, machine, plan, args, speed)
        plan["feed"] = feed_figures(
            c["tokens"], machine.world, c["step_s"], job.data.num_workers, not machine.on_cpu,
            job.data.store,
        )  # fmt: skip
        timing(plan, cfg, job, cal, args.anchor)
    print(json.dumps(plan, indent=1) if args.json else format_plan(plan))
    return 0


def configured_batch(
    cfg: Any, job: Any, machine: Any, plan: dict[str, Any], args: argparse.Namespace, speed: Speed
) -> dict[str, Any]:
    """The config's own batch (data.max_tokens x train.grad_accum on the planned ranks, at its
    train.zero_stage): whether it fits and its step time, beside the recommendation."""
    from launch.cost_model.activations import activation_bytes
    from launch.cost_model.plan import model_state_bytes, step_time
    from trainer.config import sums_in_fp32

    stage = plan["stages"][job.train.zero_stage]
    micro, accum = job.data.max_tokens, job.train.grad_accum
    checkpointing = job.train.activation_checkpointing
    fp32_sums = sums_in_fp32(
        job.train.grad_accum_dtype, plan["precision"], accum, job.train.zero_stage
    )
    n, world = int(plan["params"]["total"]), machine.world
    grads = {
        fp32: model_state_bytes(n, job.train.zero_stage, world, plan["precision"], None, 0, fp32)
        for fp32 in (False, True)
    }  # the stage's row was planned at the recommended accumulation: the config's may differ
    more = grads[fp32_sums]["grads"] - grads[bool(stage["fp32_sums"])]["grads"]
    peak = float(stage["total"]) + more + activation_bytes(
        cfg, micro, plan["precision"], checkpointing, whole_model_compiled(job),
        machine.loss_chunking(),
    )  # fmt: skip
    tokens = micro * accum * machine.world
    step = step_time(cfg, machine, tokens, args.seq_len, checkpointing, args.fill, accum,
                     job.train.zero_stage)  # fmt: skip
    timed = [s for m, a, s in speed.timed if (m, a) == (micro, accum)]
    return {
        "timed": bool(timed),  # the calibration timed this very batch: its step is taken
        "micro_tokens": micro,
        "grad_accum": accum,
        "stage": job.train.zero_stage,
        "tokens": tokens,
        "peak": peak,
        "fp32_sums": fp32_sums,
        "fits": peak <= machine.usable_bytes(),
        "step_s": timed[-1] if timed else step["step_s"],
    }


def timing(
    plan: dict[str, Any], cfg: Any, job: Any, cal: Calibration | None, anchor: str | None
) -> None:
    """The batch every time line prices (the config's own where it is the recommended one,
    at its timed step where the calibration timed it), what the run spends beside its steps,
    the horizon of a time budget, the time to the anchor's BLEU and to train.max_steps."""
    from launch.cost_model.run_time import budget_horizon, run_time

    c = plan["configured"]
    own = c["tokens"] == plan["tokens_per_step_per_side"] and c["fits"]
    step_s = float(c["step_s"] if own else plan["step_s"])
    plan["time_basis"] = {
        "batch": "configured" if own else "recommended",
        "tokens": int(plan["tokens_per_step_per_side"]),
        "step_s": step_s,
        "timed": bool(own and c["timed"]),
    }
    rt = run_time(cal, job.train, int(plan["world"]), step_s, plan["checkpoint"]["save_s"])
    plan["run_time"] = {
        "priced": rt.priced,
        "why": rt.why,
        "startup_s": rt.startup_s,
        "probe_s": rt.probe_s,
        "eval_s": rt.costs.eval_s,
        "bleu_s": rt.costs.bleu_s,
        "save_s": rt.costs.save_s,
        "eval_every": rt.cadence.eval_every,
        "bleu_every": rt.cadence.bleu_every,
        "save_every": rt.cadence.save_every,
        "budget_minutes": float(job.train.budget_minutes),
        "horizon": budget_horizon(job.train, rt),
    }
    plan["quality"] = quality_figures(cfg, job.train, plan["time_basis"], anchor, rt)
    plan["total_hours"] = rt.seconds_to(int(job.train.max_steps)) / 3600


def quality_figures(
    cfg: Any, train: Any, basis: dict[str, Any], anchor_name: str | None, rt: Any
) -> dict | None:
    """Steps and hours to the nearest (or named) anchor's BLEU at the time lines' batch: its
    steps (up to the evaluation that scores BLEU, for a BLEU target), evaluations and saves."""
    from launch.cost_model.quality import pick_anchor, time_to_quality
    from launch.cost_model.run_time import at_bleu_evaluation

    tokens = int(basis["tokens"])
    try:
        anchor = pick_anchor(cfg, tokens, anchor_name)
    except ValueError as exc:
        raise UsageError(f"--anchor: {exc}") from None
    if anchor is None:
        return None
    q = time_to_quality(anchor, tokens, float(basis["step_s"]), cfg.pre_norm)
    q["steps"] = at_bleu_evaluation(int(q["steps"]), train)
    seconds = rt.target_seconds(q["steps"]) if train.target_bleu > 0 else rt.seconds_to(q["steps"])
    q["hours"] = seconds / 3600
    return q


def checkpoint_figures(
    plan: dict[str, Any], job: Any, machine: Any, precision: str, write_gbs: float
) -> dict[str, Any]:
    """Size and save time of one checkpoint of the planned job (its recommended ZeRO stage,
    else the config's), and whether the save fits train.stop_grace_s."""
    from launch.cost_model.save import fits_grace, save_plan

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
