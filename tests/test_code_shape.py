"""The shape the packages keep: small files and functions, and one module that knows the run
directory's layout (trainer/run_dir.py), so no other code builds a path from its names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "data_pipeline", "trainer", "serve", "launch", "bench")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60
LAYOUT = ROOT / "trainer" / "run_dir.py"


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def layout_names() -> set[str]:
    """The string constants of the layout module: file and directory names of a run dir."""
    tree = ast.parse(LAYOUT.read_text())
    return {
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)
    }


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_files_and_functions_are_small(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_FILE_LINES
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{node.name}: {length} lines"


def test_only_the_layout_module_joins_run_dir_names() -> None:
    names = layout_names()
    assert {"checkpoints", "latest", "metrics.jsonl", "complete"} <= names
    offenders = []
    for path in sources():
        if path == LAYOUT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            joined = (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Div)
                and isinstance(node.right, ast.Constant)
                and node.right.value in names
            )
            if joined:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} / {node.right.value!r}")  # type: ignore[attr-defined]
    assert not offenders, offenders
