"""The record of a run's attempts and the crash-loop rule (trainer/attempts.py)."""

from __future__ import annotations

import json
from pathlib import Path

from trainer.attempts import (
    append_event,
    crash_loop,
    one_line,
    read_attempts,
    start_event,
)


def record(path: Path, *events: dict) -> None:
    for event in events:
        append_event(path, event)


def test_attempts_read_back_with_their_ends_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "attempts.jsonl"
    record(
        path,
        start_event(None), {"event": "end", "exit_code": 75},
        start_event("step_00000004"), {"event": "error", "rank": 1, "step": 5, "error": "E: x"},
        start_event("step_00000004"),
    )  # fmt: skip
    path.write_text(path.read_text() + "not json\n")  # a torn last line is skipped
    attempts = read_attempts(path)
    assert [(a.resumed, a.ended, a.error, a.step) for a in attempts] == [
        (None, True, None, None),
        ("step_00000004", False, "E: x", 5),
        ("step_00000004", False, None, None),
    ]
    assert all(json.loads(x)["time"] for x in path.read_text().splitlines()[:-1])


def test_a_crash_loop_is_limit_unended_attempts_from_the_same_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "attempts.jsonl"
    tag = "step_00000004"
    record(path, start_event(tag), {"event": "error", "rank": 0, "step": 5, "error": "OOM: y"})
    record(path, start_event(tag))  # killed outright: no error line
    assert crash_loop(read_attempts(path), tag, 3) is None  # two so far
    record(path, start_event(tag))
    why = crash_loop(read_attempts(path), tag, 3)
    assert why is not None and "\n" not in why
    assert why.startswith(f"crash loop: the last 3 attempts resumed from checkpoint {tag} ")
    assert "failed at step 5" in why and "(OOM: y)" in why
    assert crash_loop(read_attempts(path), "step_00000006", 3) is None  # progress was made
    record(path, {"event": "end", "exit_code": 75})
    assert crash_loop(read_attempts(path), tag, 3) is None  # the last one ended


def test_one_line_of_an_exception() -> None:
    assert one_line(RuntimeError("out of memory\nmore")) == "RuntimeError: out of memory"
    assert one_line(KeyboardInterrupt()) == "KeyboardInterrupt"
