"""The table `paperscale plan` prints: memory per ZeRO stage, the recommended batch, where the
speed comes from, the step time, the config's own batch, the time to a BLEU and the checkpoint.
"""

from __future__ import annotations

from launch.cost_model.feed import feed_lines
from launch.cost_model.plan import GIB
from launch.cost_model.quality import duration, quality_lines
from launch.cost_model.run_time import run_time_lines
from launch.cost_model.save import checkpoint_lines
from launch.cost_model.speed import format_rate


def _head_lines(plan: dict) -> list[str]:
    """Parameters, ranks, target and precision."""
    p = plan["params"]
    lines = [
        f"parameters       {p['total']:,} (embeddings {p['embeddings']:,}, encoder "
        f"{p['encoder']:,}, decoder {p['decoder']:,})",
        f"ranks            {plan['world']} x {plan['gpu_mem_gib']:.4g} GiB "
        f"({plan['usable_gib']:.1f} GiB usable per rank), {plan['precision']}, "
        f"activation checkpointing {'on' if plan['activation_checkpointing'] else 'off'}, "
        f"loss {'fused by torch.compile' if plan.get('compiled') else 'chunked'}",
        f"target           {plan['target_tokens_per_side']:,} tokens per side per step"
        + (f" ({plan['target_from']})" if plan.get("target_from") else ""),
    ]
    if plan.get("precision_from"):
        lines.append(f"precision        {plan['precision']} ({plan['precision_from']})")
    return lines


def _stage_lines(plan: dict) -> list[str]:
    """One row per ZeRO stage."""
    lines = ["GiB per rank  params   grads   optim  buffers  states  micro-tok  accum  act   peak"]
    for s in plan["stages"]:
        g = {k: float(s[k]) / GIB for k in ("params", "grads", "optimizer", "buffers", "total")}
        fit = (
            f"{int(s['micro_tokens']):>9,}  {int(s['grad_accum']):>5}  "
            f"{float(s['activations']) / GIB:5.1f}  {float(s['peak']) / GIB:5.1f}"
            if s["fits"]
            else "  does not fit"
        )
        mark = " *" if s["stage"] == plan["recommended_stage"] else "  "
        lines.append(
            f"ZeRO {s['stage']}{mark}     {g['params']:6.2f}  {g['grads']:6.2f}  "
            f"{g['optimizer']:6.2f}  {g['buffers']:7.2f}  {g['total']:6.2f}  {fit}"
        )
    return lines


def _batch_lines(plan: dict) -> list[str]:
    """The recommended batch and why its micro-batch is that size."""
    micro, fit = int(plan["micro_tokens"]), int(plan["max_micro_tokens"])
    ratio = plan["tokens_per_step_per_side"] / plan["target_tokens_per_side"]
    if micro == fit:
        why = "the largest that fits"
    elif plan["grad_accum"] == 1:
        why = f"one step's share per rank ({fit:,} would fit)"
    else:
        why = (
            f"shrunk from the {fit:,} that fit: their step would miss the target by more "
            f"than {plan['batch_tolerance']:.0%} (--batch-tolerance)"
        )
    return [
        f"recommended      ZeRO {plan['recommended_stage']}: {micro:,} tokens x "
        f"{plan['grad_accum']} accumulation x {plan['world']} ranks = "
        f"{plan['tokens_per_step_per_side']:,} tokens per side per step ({ratio:.2f} x target)",
        f"micro-batch      {why}",
        f"overrides        {' '.join(plan['overrides'])}",
    ]


def overlap_words(plan: dict) -> str:
    """How much of the sync the step waits for (launch/cost_model/step_time.py exposed_sync)."""
    if not plan.get("overlap_comm"):
        return "after the backward (train.overlap_comm off)"
    if plan["recommended_stage"] in (0, 1, 2):
        return "the part train.overlap_comm does not hide behind the backward"
    return f"after the backward (overlap_comm hides nothing at ZeRO {plan['recommended_stage']})"


def _time_lines(plan: dict) -> list[str]:
    """Speed source, FLOPs, step time, the config's own batch, time to BLEU and max_steps."""
    lines = []
    if plan.get("speed_line"):
        lines.append(f"speed            {plan['speed_line']}")
    full = f", micro-batches {plan['fill']:.0%} full (--fill)" if plan["fill"] != 1 else ""
    lines += [
        f"FLOPs per step   {plan['flops_per_step']:.3e}",
        f"step time        {plan['step_s']:.3f} s per recommended step "
        f"({plan['tokens_per_step_per_side']:,} tokens per side) = "
        f"{plan['compute_s']:.3f} s of compute at "
        f"{plan['mfu']:.0%} MFU of {format_rate(plan['peak_tflops'] * 1e12)} per rank + "
        f"{plan['overhead_s'] * 1e3:.1f} ms of overheads"
        + (f" + {plan['comm_s'] * 1e3:.1f} ms of gradient sync" if plan.get("comm_s") else "")
        + full,
    ]
    if plan.get("comm_s"):
        lines.append(
            f"gradient sync    {plan['comm_s'] * 1e3:.1f} ms per step: ZeRO "
            f"{plan['recommended_stage']} moves {plan['comm_bytes'] / 1e9:.2f} GB per rank "
            f"({plan['precision']}) over {plan['comm_link']} (assumed ~80 % of it; "
            f"launch/cost_model/comm.py), {overlap_words(plan)}"
        )
    c = plan.get("configured")
    if c:
        fits = "fits" if c["fits"] else "does NOT fit"
        lines.append(
            f"as configured    {c['micro_tokens']:,} x {c['grad_accum']} x {plan['world']} ranks "
            f"= {c['tokens']:,} tokens per side at ZeRO {c['stage']} ({fits}, peak "
            f"{c['peak'] / GIB:.1f} GiB{', gradients summed in fp32' if c['fp32_sums'] else ''})"
            f": step {c['step_s']:.3f} s"
            + (" (timed at this batch by the calibration)" if c.get("timed") else "")
        )
    lines += feed_lines(plan.get("feed"), "configured")
    return lines + _run_lines(plan)


def _run_lines(plan: dict) -> list[str]:
    """The batch the time lines price, what the run spends beside its steps, a budget's
    horizon, the time to BLEU and to train.max_steps."""
    basis = plan.get("time_basis")
    if not basis:
        return []
    timed = ", timed by the calibration" if basis["timed"] else ""
    lines = [
        f"time lines       price the {basis['batch']} batch: {basis['tokens']:,} tokens per "
        f"side at {basis['step_s']:.3f} s per step{timed}",
        *run_time_lines(plan),
    ]
    if "quality" in plan:
        lines += quality_lines(plan["quality"], int(basis["tokens"]))
    if (plan.get("run_time") or {}).get("horizon") is None:
        lines.append(
            f"max_steps        {duration(plan['total_hours'])} for train.max_steps="
            f"{plan['max_steps']:,}, evaluations and saves included"
        )
    return lines


def format_plan(plan: dict) -> str:
    """The human table."""
    lines = [*_head_lines(plan), "", *_stage_lines(plan), ""]
    if plan["recommended_stage"] is None:
        lines.append("no stage fits: more ranks, more memory, or activation checkpointing")
        if plan.get("speed_line"):
            lines.append(f"speed            {plan['speed_line']}")
        return "\n".join(lines)
    lines += [*_batch_lines(plan), *_time_lines(plan)]
    return "\n".join(lines + checkpoint_lines(plan.get("checkpoint")))
