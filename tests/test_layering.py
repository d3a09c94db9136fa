"""The packages' layers: each may import only itself and the packages below it, and no
module-level import cycle exists inside any of them (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each package and the project packages it may import (besides itself), from the bottom up.
MAY_IMPORT: dict[str, set[str]] = {
    "model": set(),
    "data_pipeline": set(),
    "trainer": {"model", "data_pipeline"},
    "serve": {"trainer", "model", "data_pipeline"},
    "launch": {"serve", "trainer", "model", "data_pipeline"},
    "bench": {"launch", "serve", "trainer", "model", "data_pipeline"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p) for package in MAY_IMPORT for p in (ROOT / package).rglob("*.py")}


def imports(path: Path, top_level_only: bool) -> set[str]:
    """Project modules `path` imports (all of them, or only those imported at module level);
    `from pkg import name` is pkg.name where that is a module of the project, else pkg."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {name for name in found if name.split(".")[0] in MAY_IMPORT}


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    allowed = MAY_IMPORT[package] | {package}
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sources(package)
        for name in sorted(imports(path, top_level_only=False))
        if name.split(".")[0] not in allowed
    ]
    assert not offenders, offenders


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a list of its nodes, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_module_level_import_cycle() -> None:
    graph = {
        module_name(path): imports(path, top_level_only=True)
        for package in MAY_IMPORT
        for path in sources(package)
    }
    graph = {name: {dep for dep in deps if dep in graph} for name, deps in graph.items()}
    assert cycle_in(graph) is None, cycle_in(graph)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": set()}) is None
