"""Suite-wide checks of how the tests are spread over pytest-xdist workers."""

from __future__ import annotations

import pytest

UNGROUPED = pytest.StashKey[str]()


def ungrouped(items: list[pytest.Item]) -> list[pytest.Item]:
    """Items marked `xdist_group` that did not get the group suffix that xdist's loadgroup
    scheduling keys on (`path::test@group`)."""
    out = []
    for item in items:
        names = sorted({str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args})
        if names and not item.nodeid.endswith("@" + "_".join(names)):
            out.append(item)
    return out


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`, tests whose grouping did not take effect fail at once: tests
    of one group (a shared trained run, a module's process group, one local Slurm) would run on
    several workers at the same time, each with its own copy of what they share. (pytest 9.2
    derives `Item.nodeid` from a field that pytest-xdist 3.8 does not rewrite.)"""
    if not getattr(config.option, "loadgroup", False):  # set on the workers of loadgroup
        return
    for item in ungrouped(items):
        item.stash[UNGROUPED] = (
            f"pytest-xdist did not apply this test's xdist_group (pytest {pytest.__version__}): "
            "its group would be spread over workers; install the versions in constraints.txt"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if UNGROUPED in item.stash:
        pytest.fail(item.stash[UNGROUPED], pytrace=False)
