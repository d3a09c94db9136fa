"""The record of a run's attempts and the crash-loop rule (trainer/attempts.py)."""

from __future__ import annotations

import json
import re
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


def test_a_watchdog_that_fired_is_reported_once_with_where_it_was_stuck(tmp_path: Path) -> None:
    """A real process whose phase outlives its watchdog: SIGALRM writes every thread's stack to
    the rank's file and ends it; the report names the rank and the frame it was stuck in,
    records it as that rank's error, and does not report it twice."""
    import subprocess
    import sys

    from trainer.attempts import report_watchdogs
    from trainer.run_dir import RunDir

    run = RunDir(tmp_path)
    stacks = run.watchdog_stacks("local.0.0", 1)
    code = (
        "import time\n"
        "from trainer.signals import Watchdog\n"
        "def wait_for_a_peer():\n"
        "    time.sleep(30)\n"
        f"dog = Watchdog(0.5, __import__('pathlib').Path({str(stacks)!r}))\n"
        "dog.arm()\n"
        "wait_for_a_peer()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -14  # SIGALRM
    quiet = run.watchdog_stacks("local.0.0", 0)
    quiet.write_text("")  # a rank killed otherwise: an empty file, dropped
    (line,) = report_watchdogs(run)
    assert line.startswith("watchdog: rank 1 ran past train.dist_timeout_s, stuck in ")
    assert "wait_for_a_peer at <string>:4" in line
    assert not stacks.exists() and not quiet.exists()
    assert "Current thread" in stacks.with_name(stacks.stem + ".reported.txt").read_text()
    (event,) = [json.loads(x) for x in run.attempts.read_text().splitlines()]
    assert event["event"] == "error" and event["rank"] == 1 and event["error"] == line
    assert report_watchdogs(run) == []


def test_stuck_at_names_the_project_frame_under_a_library_one() -> None:
    from trainer.signals import stuck_at

    dump = (
        "Thread 0x01 (most recent call first):\n"
        '  File "/x/threading.py", line 327 in wait\n\n'
        "Current thread 0x02 (most recent call first):\n"
        '  File "/v/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
        '  File "/v/torch/distributed/c10d_logger.py", line 83 in wrapper\n'
        '  File "/w/main/trainer/loop.py", line 267 in maybe_log\n'
        '  File "/w/main/trainer/loop.py", line 73 in train\n'
    )
    assert stuck_at(dump) == (
        "all_reduce at /v/torch/distributed/distributed_c10d.py:3252, "
        "from trainer/loop.py:267 maybe_log"
    )


def test_a_watchdog_in_the_first_step_names_the_rank_behind_it(tmp_path: Path) -> None:
    """Rank 0's watchdog fired in its first step while rank 1 was still restoring: the report
    says where rank 0 was in its start-up and whom it waited for, from their records."""
    from trainer.attempts import report_watchdogs
    from trainer.run_dir import RunDir
    from trainer.startup import StartTrace

    run = RunDir(tmp_path)
    waiting, behind = (StartTrace(run.logs, "local.0.0", r, 2) for r in range(2))
    behind.enter("restore")
    waiting.enter("first step")
    run.watchdog_stacks("local.0.0", 0).write_text(
        'Current thread 0x01 (most recent call first):\n  File "x.py", line 3 in all_reduce\n'
    )
    (line,) = report_watchdogs(run)
    assert line.startswith("watchdog: rank 0 ran past train.dist_timeout_s, stuck in all_reduce")
    assert ", in its start-up at 'first step' for rank 1 (" in line
    assert re.search(r"still at 'restore' since \d+ s \(every thread's stack: ", line), line
    waiting.enter("done")  # past its first step: a later watchdog names no start-up
    run.watchdog_stacks("local.0.0", 0).write_text(
        'Current thread 0x01 (most recent call first):\n  File "x.py", line 3 in all_reduce\n'
    )
    (line,) = report_watchdogs(run)
    assert "start-up" not in line
