"""report.png and the text summary, from metrics.jsonl alone; the `paperscale report` command."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from launch.cli import main
from trainer.metrics import read_metrics as read_records
from trainer.report import summarize, write_report


def write_metrics(run_dir: Path, n: int = 40) -> None:
    lines = []
    for step in range(1, n + 1):
        record = {
            "step": step,
            "loss": 6.0 / step**0.5,
            "lr": 1e-3 * min(step / 10, (10 / step) ** 0.5),
            "tokens_per_s": 1000.0 + step,
            "src_tokens_per_s": 500.0,
            "tgt_tokens_per_s": 500.0 + step,
            "grad_norm": 1.0 / step,
            "mfu": 0.01,
        }
        if step % 10 == 0:
            record.update({"valid_loss": 5.0 / step**0.5, "bleu": float(step)})
        lines.append(json.dumps(record))
    lines.append('{"step": 41, "loss"')  # cut by a crash mid-write
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_report_png_is_written_and_summary_names_the_figures(tmp_path: Path) -> None:
    write_metrics(tmp_path)
    path, summary = write_report(tmp_path)
    assert path == tmp_path / "report.png"
    height, width, _ = matplotlib.image.imread(path).shape
    assert width >= 1200 and height >= 700
    assert "steps            40" in summary
    assert "best 40.000 at step 40" in summary  # BLEU
    assert "train loss       6.000 (first)" in summary


def test_missing_metrics_are_drawn_as_empty_panels(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")
    path, summary = write_report(tmp_path, tmp_path / "out" / "r.png")
    assert path.is_file()
    assert "valid" not in summary


def test_read_records_skips_a_truncated_line(tmp_path: Path) -> None:
    write_metrics(tmp_path, n=3)
    assert [r["step"] for r in read_records(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert summarize([]) == "no metrics logged yet"


def test_report_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_metrics(tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "valid BLEU" in out and str(tmp_path / "report.png") in out
    assert (tmp_path / "report.png").is_file()


def test_report_command_on_a_dir_without_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err


def test_the_plan_in_the_run_dir_is_set_beside_what_the_run_did(tmp_path: Path) -> None:
    """RUN/plan.json (`paperscale plan --json`): its step at the config's own batch against the
    median measured step of the run's second half (target tokens per step / per second), and
    its time and steps to the target against the run's time_to_target_s."""
    records = []
    for step in range(1, 21):
        per_s = 1000.0 if step <= 10 else 800.0  # the second half: 2000 / 800 = 2.5 s a step
        records.append({"step": step, "loss": 3.0, "tgt_tokens_per_step": 2000.0,
                        "tgt_tokens_per_s": per_s})  # fmt: skip
    records[-1]["time_to_target_s"] = 60.0
    records[3]["horizon"] = 25.0  # a budget's horizon, fixed after step 4
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    _, plain = write_report(tmp_path)
    assert "planned" not in plain  # no plan in the run dir: the summary alone
    plan = {"step_s": 9.9, "configured": {"step_s": 2.0}, "quality": {"hours": 0.02, "steps": 16},
            "run_time": {"horizon": 20}}  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    _, summary = write_report(tmp_path)
    rows = {line[:17].strip(): line[17:].split() for line in summary.splitlines()[-5:]}
    assert rows["step"] == ["2", "2.5", "1.25", "s"]  # the configured batch's step, not 9.9
    assert rows["time to target"] == ["72", "60", "0.83", "s"]
    assert rows["steps to target"] == ["16", "20", "1.25", "steps"]
    assert rows["budget horizon"] == ["20", "25", "1.25", "steps"]
    (tmp_path / "plan.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"plan\.json is not a plan's JSON"):
        write_report(tmp_path)
