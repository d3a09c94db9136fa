"""The ranks' start-up records and the line a rank that waited for its peers prints."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch.distributed as dist

from trainer.startup import (
    DONE,
    NAMED_AT_MOST,
    StartTrace,
    read_record,
    record_path,
    waited_for_peers,
    waiting_for,
)

ATTEMPT = "local.0.0"


def traces(logs: Path, world: int) -> list[StartTrace]:
    return [StartTrace(logs, ATTEMPT, rank, world) for rank in range(world)]


def test_a_record_follows_its_rank_and_ends_with_the_first_step(tmp_path: Path) -> None:
    (mine,) = traces(tmp_path, 1)
    mine.enter("start")
    mine.enter("build")
    record = read_record(tmp_path, ATTEMPT, 0)
    assert record is not None and (record.phase, record.world_size) == ("build", 1)
    assert not list(tmp_path.glob(".*tmp*"))  # written through a temporary file
    mine.enter(DONE)
    assert not record_path(tmp_path, ATTEMPT, 0).exists()
    mine.enter("restore")  # past its start-up a rank writes no record again
    assert read_record(tmp_path, ATTEMPT, 0) is None
    assert waiting_for(tmp_path, ATTEMPT, 0, 0.0) == ""


def test_the_line_names_the_ranks_behind_and_those_that_never_started(tmp_path: Path) -> None:
    ranks = traces(tmp_path, 8)
    for trace in ranks[:6]:
        trace.enter("settle")
    ranks[0].enter("build")
    ranks[3].enter("build")
    line = waiting_for(tmp_path, ATTEMPT, 0, time.time() + 7)
    assert line.startswith("in its start-up at 'build' for rank 1 (")
    assert "still at 'settle' since 7 s" in line
    named = [f"rank {r}" for r in (1, 2, 4, 5)]
    assert all(n in line for n in named) and "rank 3" not in line  # rank 3 got there too
    assert len(named) == NAMED_AT_MOST and line.endswith(" and 2 more ranks")


def test_a_rank_that_never_started_and_a_collective_that_did_not_answer(tmp_path: Path) -> None:
    first, _ = traces(tmp_path, 2)
    first.enter("process group")
    assert waiting_for(tmp_path, ATTEMPT, 0, 0.0) == (
        "in its start-up at 'process group' for rank 1, which never started (no start-up record)"
    )
    second = StartTrace(tmp_path, ATTEMPT, 1, 2)
    second.enter("process group")
    assert "every rank got there: the collective itself did not answer" in waiting_for(
        tmp_path, ATTEMPT, 0, 0.0
    )


def test_only_a_collective_that_did_not_answer_gets_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, _ = traces(tmp_path, 2)
    first.enter("agree")
    assert waited_for_peers(dist.DistStoreError("Timed out after 11 seconds waiting for clients"))
    assert waited_for_peers(RuntimeError("[gloo] Timed out waiting 10000ms for recv operation"))
    assert not waited_for_peers(ValueError("train.lr must be > 0"))
    # rank 0's own store could not listen (torchrun's port taken meanwhile): no peer to name
    taken = "The server socket has failed to listen on any local network address. port: 41595,"
    assert not waited_for_peers(dist.DistNetworkError(f"{taken} name: EADDRINUSE"))
    first.fail(10, ValueError("a config error on every rank names no peer"))
    assert capsys.readouterr().err == ""
    first.fail(10, RuntimeError("[gloo] Timed out waiting 10000ms for recv operation"))
    err = capsys.readouterr().err
    assert err.startswith("paperscale: error: rank 0 (")
    assert ") waited train.dist_timeout_s=10 s in its start-up at 'agree'" in err
    assert "for rank 1, which never started" in err
    # a peer that went away at once: no timeout was waited out
    first.fail(10, RuntimeError("Connection closed by peer [127.0.0.1]:41234"))
    err = capsys.readouterr().err
    assert ") lost a peer's connection (a rank that exited or died) in its start-up" in err
    assert "dist_timeout_s" not in err


def test_a_record_of_an_earlier_start_of_the_group_is_not_this_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local attempt's key repeats from one `train` to the next: rank 1's record left by an
    earlier start (another torchrun run id) does not pass for this start's."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "earlier")
    StartTrace(tmp_path, ATTEMPT, 1, 2).enter("restore")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "now")
    StartTrace(tmp_path, ATTEMPT, 0, 2).enter("build")
    assert waiting_for(tmp_path, ATTEMPT, 0, 0.0).endswith(
        "for rank 1, which never started (no start-up record)"
    )


def test_a_time_read_from_a_file_just_before_a_peers_record_reads_0_s(tmp_path: Path) -> None:
    """A watchdog's time is its stack file's mtime, which the kernel keeps coarser than
    time.time(): a peer's record from the same instant can be a few ms later. Not '-0 s'."""
    mine, behind = traces(tmp_path, 2)
    behind.enter("restore")
    mine.enter("first step")
    record = read_record(tmp_path, ATTEMPT, 1)
    assert record is not None
    line = waiting_for(tmp_path, ATTEMPT, 0, record.since - 0.004)
    assert "still at 'restore' since 0 s" in line, line
