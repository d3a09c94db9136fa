"""`paperscale plan`'s data line: the step's demand against what the loader workers deliver."""

from __future__ import annotations

import json

import pytest

from launch.cost_model.feed import (
    FEED_SHARE,
    WORKER_TOKENS_PER_S,
    feed_figures,
    feed_lines,
    planned_workers,
)
from tests.launch.conftest import plan_cli


def test_demand_is_both_sides_per_rank_per_step_time() -> None:
    feed = feed_figures(110_592, 8, 0.079, 1, on_gpu=True)
    packed = WORKER_TOKENS_PER_S["packed"]  # what `auto` reads where prepare wrote it
    assert feed["demand_tokens_per_s"] == pytest.approx(2 * 110_592 / 8 / 0.079)
    assert feed["supply_tokens_per_s"] == packed and "packed ids" in feed["workers_from"]
    assert feed["share"] == pytest.approx(feed["demand_tokens_per_s"] / packed)
    two = feed_figures(110_592, 8, 0.079, 2, on_gpu=True)
    assert two["share"] == pytest.approx(feed["share"] / 2)
    tar = feed_figures(110_592, 8, 0.079, 1, on_gpu=True, store="tar")
    assert tar["supply_tokens_per_s"] == WORKER_TOKENS_PER_S["tar"] < packed
    assert "tar shards" in tar["workers_from"]


@pytest.mark.parametrize(
    ("value", "on_gpu", "workers", "said"),
    [("auto", True, 1, "priced at 1"), ("auto", False, 1, "1 on a CPU"), (3, True, 3, "=3"),
     (0, True, 0, "the rank reads itself")],
)  # fmt: skip
def test_the_planned_workers_say_where_they_come_from(
    value: int | str, on_gpu: bool, workers: int, said: str
) -> None:
    n, how = planned_workers(value, on_gpu)
    assert n == workers and said in how


def test_a_step_faster_than_its_feed_is_warned_of() -> None:
    slow = feed_figures(4096, 1, 1.0, 1, on_gpu=True)
    assert not slow["bottleneck"] and len(feed_lines(slow, "configured")) == 1
    fast_step = 2 * 4096 / (WORKER_TOKENS_PER_S["packed"] * FEED_SHARE) / 2  # twice the share
    fast = feed_figures(4096, 1, fast_step, 1, on_gpu=True)
    assert fast["bottleneck"]
    lines = feed_lines(fast, "configured")
    assert lines[1].startswith("WARNING          the loader would be the bottleneck")


def test_cli_prints_the_data_line_of_the_configured_step() -> None:
    args = ["--config", "configs/big_mlperf_8gpu.yaml", "--nodes", "1", "--gpus-per-node", "8"]
    proc = plan_cli(*args, "--gpu", "h200", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    c, feed = plan["configured"], plan["feed"]
    assert feed["demand_tokens_per_s"] == pytest.approx(2 * c["tokens"] / 8 / c["step_s"])
    proc = plan_cli(*args, "--gpu", "h200", "data.num_workers=2")
    assert proc.returncode == 0, proc.stderr
    assert "data             the configured step takes " in proc.stdout
    assert "2 loader worker(s) per rank" in proc.stdout and "data.num_workers=2" in proc.stdout
