"""The documentation holds to the code: README.md stays short, no page names a commit, every
relative link points to a file, and every shell block marked runnable runs as written.

Pages: README.md and docs/*.md. A runnable block is a ```bash fence whose line before is
`<!-- runnable -->`. Its lines (backslash continuations joined) run as one
`bash -e -o pipefail -c` script from the repository root, so every command must exit 0. The
environment is the test's own, with the bin directory of the Python running the tests first on
PATH (its `paperscale` console script), PYTHONPATH set to the repository root (the checkout's
code is imported, whatever checkout the venv was installed from), OMP_NUM_THREADS=1 and
WANDB_MODE=offline; HOME is left alone (the machine cache lives in ~/.cache/paperscale). The
pages write the project's venv as `.venv/bin/...`; a block runs that as the tool of the same
name in the test's venv, which may live elsewhere. A block may not leave new entries in the
repository root.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250
MARKER = "<!-- runnable -->"
SECONDS_PER_COMMAND = 120
MIN_RUNNABLE_BLOCKS = 5

# A commit hash: a word of 7-40 lowercase hex digits with at least one letter and one digit.
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")
VENV_BIN = re.compile(r"(?<![\w./-])\.venv/bin/")


def pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def where(path: Path, lineno: int) -> str:
    return f"{path.relative_to(ROOT)}:{lineno}"


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    out, in_fence = [], False
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            out.append((lineno, line))
    return out


@dataclass(frozen=True)
class Block:
    """One runnable block: where its fence opens, and its commands."""

    path: Path
    lineno: int
    commands: tuple[str, ...]

    def __str__(self) -> str:
        return where(self.path, self.lineno)


def join_continuations(lines: list[str]) -> list[str]:
    """The block's commands: backslash-continued lines joined, blank lines dropped."""
    commands: list[str] = []
    pending = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command:
            commands.append(command)
    if pending.strip():
        commands.append(pending.strip())
    return commands


def runnable_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = lines[i + 1].strip() if i + 1 < len(lines) else ""
        assert fence == "```bash", f"{where(path, i + 1)}: {MARKER} must precede a ```bash fence"
        end = next((j for j in range(i + 2, len(lines)) if FENCE.match(lines[j])), None)
        assert end is not None, f"{where(path, i + 2)}: the runnable block is never closed"
        commands = tuple(join_continuations(lines[i + 2 : end]))
        blocks.append(Block(path, i + 2, commands))
    return blocks


def all_runnable_blocks() -> list[Block]:
    return [block for page in pages() for block in runnable_blocks(page)]


def block_env() -> dict[str, str]:
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    env["WANDB_MODE"] = "offline"
    return env


def script_of(block: Block) -> str:
    venv_bin = str(Path(sys.executable).parent) + "/"
    return "\n".join(VENV_BIN.sub(lambda _: venv_bin, c) for c in block.commands) + "\n"


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines, at most {MAX_README_LINES}"


def test_the_hash_pattern_tells_hashes_from_words() -> None:
    for text in ("see bf7109d", "at 9a2c993 then", "d8a641d3e1f0c2b4a6e8f0d2c4b6a8e0f2d4c6b8"):
        assert COMMIT_HASH.search(text), text
    for text in ("deadbeef", "1234567", "sha256", "5.930e+14", "step_00000100", "a100", "cafe42"):
        assert not COMMIT_HASH.search(text), text


def test_no_page_names_a_commit() -> None:
    hits = [
        f"{where(page, lineno)}: {match.group()}"
        for page in pages()
        for lineno, line in enumerate(page.read_text().splitlines(), 1)
        for match in COMMIT_HASH.finditer(line)
    ]
    assert not hits, "commit hashes in the documentation:\n" + "\n".join(hits)


def test_every_relative_link_points_to_a_file() -> None:
    broken = []
    for page in pages():
        for lineno, line in prose_lines(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # https:, mailto:, an anchor on the same page
                path = (page.parent / target.split("#", 1)[0]).resolve()
                if not path.exists():
                    broken.append(f"{where(page, lineno)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {t.split("#", 1)[0] for _, line in prose_lines(README) for t in LINK.findall(line)}
    docs = [f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))]
    missing = [name for name in docs if name not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_runnable_blocks_are_found() -> None:
    blocks = all_runnable_blocks()
    assert len(blocks) >= MIN_RUNNABLE_BLOCKS, [str(b) for b in blocks]
    assert all(block.commands for block in blocks), [str(b) for b in blocks if not b.commands]
    assert any(block.path == README for block in blocks)


def test_continuations_are_joined() -> None:
    lines = ["paperscale plan --config a.yaml \\", "    --gpu h100  # a comment", "", "echo x"]
    assert join_continuations(lines) == [
        "paperscale plan --config a.yaml      --gpu h100  # a comment",
        "echo x",
    ]


@pytest.mark.parametrize("block", all_runnable_blocks(), ids=str)
def test_runnable_block_runs(block: Block) -> None:
    before = set(os.listdir(ROOT))
    try:
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script_of(block)],
            cwd=ROOT, env=block_env(), capture_output=True, text=True,
            timeout=SECONDS_PER_COMMAND * len(block.commands),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block}: did not finish in {SECONDS_PER_COMMAND} s per command")
    assert proc.returncode == 0, (
        f"{block}: exit {proc.returncode}\n{script_of(block)}\n{proc.stderr[-3000:]}"
    )
    assert proc.stdout.strip(), f"{block}: printed nothing"
    left = sorted(set(os.listdir(ROOT)) - before)
    assert not left, f"{block}: left {left} in the repository root"
