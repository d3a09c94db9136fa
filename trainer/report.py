"""`paperscale report RUN`: RUN/report.png (loss, lr, throughput, BLEU, ... against step) and a
short text summary, both from RUN/metrics.jsonl alone, so it works on a finished, running or
crashed run and on any machine that has the run dir.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from trainer.metrics import Record, read_metrics
from trainer.run_dir import RunDir


def series(records: list[Record], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that hold a finite number under `key`."""
    steps, values = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            steps.append(int(r["step"]))
            values.append(float(v))
    return steps, values


def _panel(
    ax: Any,
    records: list[Record],
    keys: list[tuple[str, str]],
    title: str,
    ylabel: str,
    log: bool = False,
    scale: float = 1.0,
) -> None:
    """One subplot: each (key, label) that has data as a line (values times `scale`); a note
    when none has. `log` takes effect only when the values span at least a factor of 5, where
    a log axis shows the late, slow part of the curve instead of flattening it."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    lo, hi = math.inf, 0.0
    for key, label in keys:
        steps, values = series(records, key)
        if not steps:
            continue
        values = [v * scale for v in values]
        marker = "o" if len(steps) <= 30 else None
        ax.plot(steps, values, label=label, marker=marker, markersize=3, linewidth=1.4)
        lo, hi = min(lo, *values), max(hi, *values)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if hi == 0.0 and lo == math.inf:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        return
    if log and lo > 0 and hi / lo >= 5:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    if len(keys) > 1:
        ax.legend(fontsize=8)


def plot_report(records: list[Record], out: Path, title: str) -> Path:
    """Write the 2x3 figure of a run's curves to `out` (PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), constrained_layout=True, sharex=True)
    _panel(
        axes[0, 0],
        records,
        [("loss", "train (label-smoothed)"), ("valid_loss", "validation")],
        "Loss per target token",
        "loss (nats)",
        log=True,
    )
    _panel(axes[0, 1], records, [("lr", "lr")], "Learning rate", "lr")
    axes[0, 1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    _panel(
        axes[0, 2],
        records,
        [
            ("tokens_per_s", "total"),
            ("src_tokens_per_s", "source"),
            ("tgt_tokens_per_s", "target"),
        ],
        "Throughput (all ranks)",
        "tokens / s",
    )
    _panel(axes[1, 0], records, [("bleu", "BLEU")], "Validation BLEU", "BLEU")
    axes[1, 0].set_ylim(bottom=0)  # BLEU is read against 0, not against its own spread
    _panel(
        axes[1, 1],
        records,
        [("grad_norm", "gradient norm")],
        "Gradient norm (after the step)",
        "L2 norm",
        log=True,
    )
    _panel(
        axes[1, 2],
        records,
        [("mfu", "MFU")],
        "Model FLOPs utilisation",
        "% of peak",
        scale=100.0,
    )
    for ax in axes.flat:  # sharex hides the upper row's step labels; show them all
        ax.xaxis.set_tick_params(labelbottom=True)
    fig.suptitle(title, fontsize=13)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _last(records: list[Record], key: str) -> tuple[int, float] | None:
    steps, values = series(records, key)
    return (steps[-1], values[-1]) if steps else None


def summarize(records: list[Record]) -> str:
    """A few lines: steps, first/last train loss, best validation loss and BLEU, throughput."""
    if not records:
        return "no metrics logged yet"
    lines = [f"steps            {records[-1]['step']}"]
    train = series(records, "loss")[1]
    if train:
        lines.append(f"train loss       {train[0]:.3f} (first) -> {train[-1]:.3f} (last)")
    for key, label, best in (("valid_loss", "valid loss", min), ("bleu", "valid BLEU", max)):
        steps, values = series(records, key)
        if values:
            i = values.index(best(values))
            lines.append(
                f"{label:<16} {values[-1]:.3f} (last, step {steps[-1]}); "
                f"best {values[i]:.3f} at step {steps[i]}"
            )
    tps = series(records, "tokens_per_s")[1]
    if tps:
        tail = sorted(tps[len(tps) // 2 :])
        lines.append(f"tokens/s         {tail[len(tail) // 2]:,.0f} (median, second half)")
    reached = _last(records, "time_to_target_s")
    if reached:
        lines.append(f"time to target   {reached[1]:,.1f} s (reached at step {reached[0]})")
    mfu = _last(records, "mfu")
    if mfu:
        lines.append(f"MFU              {100 * mfu[1]:.2f}% (last)")
    return "\n".join(lines)


def measured_step_s(records: list[Record]) -> float | None:
    """The median training step of the second half of the run's log windows: real target
    tokens per step / target tokens per second (evaluations and saves paused that clock)."""
    per_step = [
        float(r["tgt_tokens_per_step"]) / float(r["tgt_tokens_per_s"]) for r in records
        if r.get("tgt_tokens_per_step") and r.get("tgt_tokens_per_s")
    ]  # fmt: skip
    tail = sorted(per_step[len(per_step) // 2 :])
    return tail[len(tail) // 2] if tail else None


def planned_against_measured(plan: dict[str, Any], records: list[Record]) -> list[str]:
    """Lines setting RUN/plan.json (`paperscale plan --json` of the run's config) beside what
    the run did: the step of the config's own batch, the time to the target, and the last step
    of a time budget."""
    lines = [f"{'':17}planned  measured  measured / planned   (RUN/plan.json)"]

    def line(label: str, planned: float | None, measured: float | None, unit: str) -> None:
        if planned is None or measured is None:
            return
        ratio = f"{measured / planned:.2f}" if planned > 0 else "n/a"
        lines.append(f"{label:<17}{planned:>7.3g}  {measured:>8.3g}  {ratio:>8} {unit}")

    configured = plan.get("configured") or {}
    line("step", configured.get("step_s", plan.get("step_s")), measured_step_s(records), "s")
    quality = plan.get("quality") or {}
    reached = _last(records, "time_to_target_s")
    hours = quality.get("hours")
    line("time to target", hours * 3600 if hours else None, reached and reached[1], "s")
    steps = quality.get("steps")
    line("steps to target", steps, reached and float(reached[0]), "steps")
    fixed = _last(records, "horizon")  # the last step a time budget fixed
    line("budget horizon", (plan.get("run_time") or {}).get("horizon"), fixed and fixed[1], "steps")
    return lines if len(lines) > 1 else []


def write_report(run_dir: Path, out: Path | None = None) -> tuple[Path, str]:
    """Plot RUN/metrics.jsonl into `out` (default RUN/report.png); returns it and the summary,
    with the plan beside what happened where the run dir holds one (RUN/plan.json)."""
    run = RunDir(run_dir)
    records = read_metrics(run.metrics)
    if not records:
        raise ValueError(f"{run.metrics} holds no metrics")
    path = plot_report(records, out or run.report, f"paperscale run: {run_dir.name}")
    summary = summarize(records)
    if run.plan.is_file():
        try:
            plan = json.loads(run.plan.read_text())
        except ValueError as exc:
            raise ValueError(f"{run.plan} is not a plan's JSON ({exc})") from None
        summary = "\n".join([summary, *planned_against_measured(plan, records)])
    return path, summary


def write_report_or_warn(run_root: Path) -> None:
    """`write_report`, a warning if it fails: the report is a convenience, the run succeeded."""
    try:
        write_report(run_root)
    except Exception as exc:
        print(f"warning: report.png could not be written: {exc}", file=sys.stderr, flush=True)
