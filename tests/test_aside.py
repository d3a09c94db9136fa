"""`--aside-group` (tests/aside.py) in a real pytest-xdist run of a small suite: the group's
tests on one worker that runs nothing else, the rest on the others; without the group's tests,
the rest on all workers but one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SUITE = """
import os, time
import pytest

def record(name):
    with open(os.path.join(os.environ["ASIDE_OUT"], name), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.xdist_group("waits")
@pytest.mark.parametrize("i", range(3))
def test_waits(i):
    time.sleep(0.1)
    record(f"waits-{i}")

@pytest.mark.parametrize("i", range(12))
def test_other(i):
    time.sleep(0.2)  # the group's worker would be free long before these are done
    record(f"other-{i}")
"""


def run_suite(tmp_path: Path, *args: str) -> dict[str, set[str]]:
    """The small suite run under `-n 3 --dist loadgroup` and `args`: worker -> tests it ran."""
    (tmp_path / "test_small.py").write_text(SUITE)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "ASIDE_OUT": str(out), "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.aside", "-p", "no:cacheprovider",
         "-n", "3", "--dist", "loadgroup", *args, "test_small.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran: dict[str, set[str]] = defaultdict(set)
    for f in out.iterdir():
        ran[f.read_text()].add(f.name)
    return ran


@pytest.mark.timeout(300)
def test_a_group_aside_runs_alone_on_a_worker_of_its_own(tmp_path: Path) -> None:
    ran = run_suite(tmp_path, "--aside-group", "waits")
    assert sum(map(len, ran.values())) == 15
    (aside,) = [w for w, names in ran.items() if any(n.startswith("waits") for n in names)]
    assert ran[aside] == {"waits-0", "waits-1", "waits-2"}, ran
    others = set(ran) - {aside}
    assert len(others) == 2, ran  # the rest shared by both other workers


@pytest.mark.timeout(300)
def test_without_the_group_collected_its_worker_runs_nothing(tmp_path: Path) -> None:
    ran = run_suite(tmp_path, "--aside-group", "waits", "-k", "other")
    assert sum(map(len, ran.values())) == 12
    assert len(ran) == 2, ran


@pytest.mark.timeout(300)
def test_without_the_option_the_group_shares_a_worker(tmp_path: Path) -> None:
    """The control: plain loadgroup spreads the others over the group's worker too."""
    ran = run_suite(tmp_path)
    (group,) = [w for w, names in ran.items() if any(n.startswith("waits") for n in names)]
    assert len(ran) == 3 and ran[group] > {"waits-0", "waits-1", "waits-2"}, ran
