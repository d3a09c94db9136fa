"""`paperscale status RUN`: where a run stands, from the files in its run dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.metrics import read_metrics
from trainer.run_dir import RunDir


def last_value(records: list[dict[str, Any]], key: str) -> tuple[int, Any] | None:
    for record in reversed(records):
        if record.get(key) is not None:
            return record["step"], record[key]
    return None


def run_status(run_dir: Path) -> dict[str, Any]:
    run = RunDir(run_dir)
    records = read_metrics(run.metrics)
    status: dict[str, Any] = {
        "run_dir": str(run_dir),
        "last_step": records[-1]["step"] if records else None,
        "last_checkpoint": run.checkpoints.latest_tag(),
    }
    for key in ("loss", "tokens_per_s", "valid_loss", "bleu"):
        found = last_value(records, key)
        status[key] = None if found is None else found[1]
    status["time_to_target"] = last_value(records, "time_to_target_s")  # (step, seconds)
    first_loss = next((r["loss"] for r in records if r.get("loss") is not None), None)
    status["first_loss"] = first_loss
    for split in ("valid", "test"):
        path = run.eval_result(split)
        if path.is_file():
            status[f"{split}_eval"] = json.loads(path.read_text())
    status["precision"] = run_precision(run)
    status["decisions"] = run_decisions(run)
    status["slurm"] = slurm_status(run_dir)
    return status


def run_precision(run: RunDir) -> str | None:
    """The precision the run trains in: the run dir's config.yaml names it once training
    started (`auto` before that, or for a run that has not started yet)."""
    from omegaconf import OmegaConf

    if not run.config.is_file():
        return None
    try:
        return str(OmegaConf.load(run.config).train.precision)
    except Exception:  # a config of another version or a damaged file: leave the line out
        return None


def run_decisions(run: RunDir) -> dict[str, dict[str, str]] | None:
    """Every `auto` as the run's first start decided it (RUN/decisions.json), if recorded."""
    from trainer.autos import DecisionError, read_record

    try:
        record = read_record(run.decisions)
    except DecisionError:
        return None
    if record is None:
        return None
    return {k: {"requested": d.requested, "value": d.value} for k, d in record.decisions.items()}


def format_decisions(decisions: dict[str, dict[str, str]]) -> str:
    """'device cpu (auto), precision fp32 (auto), attention flash (set)'."""
    return ", ".join(
        f"{k} {d['value']} ({'auto' if d['requested'] == 'auto' else 'set'})"
        for k, d in decisions.items()
    )


def slurm_status(run_dir: Path) -> dict[str, Any] | None:
    """The scheduler's state of the job `paperscale submit` recorded for this run, if any."""
    from launch.slurm.submit import job_state, read_record

    record = read_record(run_dir)
    return None if record is None else job_state(str(record["job_id"]))


def format_slurm(job: dict[str, Any]) -> str:
    if job.get("scheduler") is None:
        return f"slurm job        {job['job_id']}: no scheduler (scontrol/squeue/sacct not found)"
    details = [
        f"{key} {job[key]}"
        for key in ("restarts", "exit_code", "reason", "nodes", "run_time")
        if job.get(key) not in (None, "", "None", "(null)")
    ]
    return f"slurm job        {job['job_id']} {job['state']}" + (
        f" ({', '.join(details)})" if details else ""
    )


def format_status(status: dict[str, Any]) -> str:
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    decided = format_decisions(status["decisions"]) if status.get("decisions") else "-"
    lines = [
        f"run dir          {status['run_dir']}",
        f"last step        {num(status['last_step'], 'd')}",
        f"last checkpoint  {status['last_checkpoint'] or '-'}",
        f"precision        {status.get('precision') or '-'}",
        f"decided          {decided}",
        f"train loss       {num(status['first_loss'], '.3f')} (first) -> "
        f"{num(status['loss'], '.3f')} (last)",
        f"tokens/s         {num(status['tokens_per_s'], ',.0f')}",
        f"valid loss       {num(status['valid_loss'], '.3f')}",
        f"valid BLEU       {num(status['bleu'], '.2f')}",
    ]
    if status.get("time_to_target"):
        step, seconds = status["time_to_target"]
        lines.append(f"time to target   {seconds:,.1f} s (reached at step {step})")
    if status.get("slurm"):
        lines.insert(1, format_slurm(status["slurm"]))
    for split in ("valid", "test"):
        ev = status.get(f"{split}_eval")
        if ev:
            lines.append(
                f"{split} BLEU (beam {ev['beam']}) {ev['bleu']:.2f}  chrF {ev['chrf']:.2f}  "
                f"({ev['sentences']} sentences; {ev['bleu_signature']})"
            )
    return "\n".join(lines)
