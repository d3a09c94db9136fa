"""`--aside-group GROUP`: under `-n N --dist loadgroup`, the tests of xdist group GROUP run on
one of the N workers, which runs nothing else.

For a group whose tests mostly wait on processes of their own (the local Slurm's jobs): on a
worker shared with the rest, that waiting holds back every test queued behind it; aside, the
other N - 1 workers keep the cores busy while it waits. Where no test of the group is
collected, the worker kept for it retires at once and the rest run on N - 1 workers. Should the
aside worker crash, the other workers take what is left of its group.
"""

from __future__ import annotations

import pytest
from xdist.scheduler.loadgroup import LoadGroupScheduling
from xdist.workermanage import WorkerController


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--aside-group",
        action="append",
        default=[],
        metavar="GROUP",
        help="under -n N --dist loadgroup: run xdist group GROUP on a worker of its own, one "
        "of the N (repeat for more groups; they share that worker)",
    )


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadGroupScheduling | None:
    groups = frozenset(config.getoption("aside_group"))
    if not groups or config.getoption("dist") != "loadgroup":
        return None
    return AsideScheduling(config, log, groups)  # type: ignore[arg-type]


class AsideScheduling(LoadGroupScheduling):
    """xdist's loadgroup scheduling, with the `aside` groups kept to the last worker."""

    def __init__(self, config: pytest.Config, log: object, aside: frozenset[str]) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self.aside = aside
        self.aside_node: WorkerController | None = None

    def _takes(self, node: WorkerController, scope: str) -> bool:
        if scope in self.aside:  # the aside worker's; anyone's once it is gone
            return node is self.aside_node or self.aside_node not in self.assigned_work
        return node is not self.aside_node

    def _next_scope(self, node: WorkerController) -> str | None:
        return next((s for s in self.workqueue if self._takes(node, s)), None)

    def _assign_work_unit(self, node: WorkerController) -> None:
        scope = self._next_scope(node)
        if scope is None:
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some(
            [collection.index(nodeid) for nodeid, done in work_unit.items() if not done]
        )

    def _reschedule(self, node: WorkerController) -> None:
        if node.shutting_down:
            return
        if self._next_scope(node) is None:  # nothing left for it: it ends after its tests
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 2:
            return
        self._assign_work_unit(node)

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed and len(self.nodes) > 1:
            last = self.nodes[-1]
            collected = self.registered_collections[last]
            if any(self._split_scope(nodeid) in self.aside for nodeid in collected):
                self.aside_node = last
            else:  # nothing to keep it for
                self.assigned_work.pop(last)
                last.shutdown()
        super().schedule()
