"""The run-dir layout: tags, `latest`, complete markers, meta and rank files (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.run_dir import (
    CheckpointDir,
    LayoutError,
    RunDir,
    run_dir_of_export,
    step_of,
    tag_for,
)


def make_tag(ckpts: CheckpointDir, step: int, complete: bool = True, ranks: int = 2) -> str:
    tag = tag_for(step)
    ckpts.tag_dir(tag).mkdir(parents=True)
    for rank in range(ranks):
        ckpts.rank_file(tag, rank).write_bytes(b"x")
    ckpts.meta_file(tag).write_text(json.dumps({"model": {"d_model": 8}, "config": {}}))
    if complete:
        ckpts.complete_marker(tag).write_text(f"{step}\n")
    return tag


def test_tags_round_trip_and_sort_by_step() -> None:
    assert tag_for(100) == "step_00000100" and step_of("step_00000100") == 100
    assert step_of(tag_for(123_456_789)) == 123_456_789


def test_complete_tags_latest_and_world_size(tmp_path: Path) -> None:
    ckpts = RunDir(tmp_path).checkpoints
    assert ckpts.complete_tags() == [] and ckpts.latest_tag() is None
    for step in (20, 3, 100):
        make_tag(ckpts, step)
    make_tag(ckpts, 200, complete=False)  # an interrupted save
    (ckpts.universal_root / "step_00000003").mkdir(parents=True)  # not a tag of its own
    assert ckpts.complete_tags() == ["step_00000003", "step_00000020", "step_00000100"]
    ckpts.latest_file.write_text("step_00000020\n")
    assert ckpts.latest_tag() == "step_00000020" == ckpts.inspect_latest()
    assert ckpts.exportable_tags() == ["step_00000003", "step_00000020"]  # never past latest
    assert ckpts.saved_world_size("step_00000020") == 2
    assert ckpts.read_meta("step_00000020")["model"] == {"d_model": 8}


def test_inspect_latest_names_what_is_wrong(tmp_path: Path) -> None:
    ckpts = RunDir(tmp_path).checkpoints
    assert ckpts.inspect_latest() is None
    make_tag(ckpts, 5, complete=False)
    ckpts.latest_file.write_text("step_00000005\n")
    with pytest.raises(LayoutError, match="has no 'complete' marker"):
        ckpts.inspect_latest()
    ckpts.latest_file.write_text("step_00000009\n")
    with pytest.raises(LayoutError, match="names 'step_00000009', which is not a checkpoint"):
        ckpts.inspect_latest()
    assert ckpts.latest_tag() is None  # the lenient reading: nothing usable
    ckpts.latest_file.write_bytes(b"\xff\xfe")
    with pytest.raises(LayoutError, match="is not readable"):
        ckpts.inspect_latest()


def test_read_meta_refuses_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    ckpts = RunDir(tmp_path).checkpoints
    tag = make_tag(ckpts, 1)
    ckpts.meta_file(tag).write_text("{not json")
    with pytest.raises(LayoutError, match="missing or not JSON"):
        ckpts.read_meta(tag)
    ckpts.meta_file(tag).write_text(json.dumps({"config": {}}))
    with pytest.raises(LayoutError, match="does not describe a model"):
        ckpts.read_meta(tag)


def test_run_dir_paths_and_summary(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.config.parent == run.metrics.parent == tmp_path
    assert len({run.config, run.metrics, run.summary, run.tokenizer, run.model, run.report}) == 6
    assert run.eval_result("test") != run.eval_result("valid")
    assert run.slurm_log("42").parent == run.logs
    assert run.read_summary() is None
    run.summary.write_text("{cut")
    assert run.read_summary() is None
    run.summary.write_text(json.dumps({"exit_code": 74}))
    assert run.read_summary() == {"exit_code": 74}
    assert run_dir_of_export(run.model) == tmp_path
    assert run_dir_of_export(run.average(5)) == run.average(5)
