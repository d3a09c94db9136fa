"""DeepSpeed's JIT ops: kept in the venv, built ahead by `make venv` (trainer/ds/ops.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer.ds.ops import cpu_info_key

ROOT = Path(__file__).resolve().parents[2]
SHOW = "import os, trainer; print(os.environ['TORCH_EXTENSIONS_DIR'])"


def _run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_extensions_live_in_the_venv_unless_chosen(tmp_path: Path) -> None:
    assert sys.prefix != sys.base_prefix, "the suite runs in the project's venv"
    assert _run(SHOW).strip() == os.path.join(sys.prefix, "torch_extensions")
    assert _run(SHOW, TORCH_EXTENSIONS_DIR=str(tmp_path)).strip() == str(tmp_path)


def test_ops_are_built_ahead_past_a_stale_lock(tmp_path: Path) -> None:
    """In a copy of the venv's ops (a rank of another test would clear a lock in the venv's
    own directory first)."""
    _run("from trainer.ds.ops import main; main()", DS_ACCELERATOR="cpu")
    built = tmp_path / "torch_extensions"
    shutil.copytree(Path(sys.prefix, "torch_extensions"), built)
    lock = built / "fused_adam" / "lock"
    lock.touch()
    hours_ago = time.time() - 7200
    os.utime(lock, (hours_ago, hours_ago))  # a build killed two hours ago
    code = "from trainer.ds.ops import main; main()"
    out = _run(code, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(built))
    assert "fused_adam: removed a stale build lock" in out and not lock.exists(), out
    assert "deepspeed_shm_comm: ready" in out and "fused_adam: ready" in out, out
    assert (built / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").is_file()


def _aged(path: Path, seconds: float) -> Path:
    path.touch()
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_a_held_build_lock_is_waited_for_and_a_stale_one_removed(tmp_path: Path) -> None:
    from trainer.ds.ops import wait_for_build_locks

    lines: list[str] = []
    wait_for_build_locks([tmp_path / "none"], lines.append, poll_s=0.01)
    assert lines == []  # nothing held: no wait, no word

    stale = _aged(tmp_path / "stale", 400)
    wait_for_build_locks([stale], lines.append, stale_s=300, poll_s=0.01)
    assert not stale.exists() and len(lines) == 1 and "removed a stale" in lines[0], lines

    # a lock held for a moment (a rank loading the op): waited for without a word
    lines.clear()
    quick = _aged(tmp_path / "quick", 0)
    threading.Timer(0.05, quick.unlink).start()
    wait_for_build_locks([quick], lines.append, stale_s=300, poll_s=0.01, quiet_s=5)
    assert lines == [] and not quick.exists()

    # a build in progress (another rank's): waited for, said once, its lock left to its owner
    held = _aged(tmp_path / "held", 1)
    timer = threading.Timer(0.3, held.unlink)
    timer.start()
    start = time.perf_counter()
    wait_for_build_locks([held], lines.append, stale_s=300, poll_s=0.01, quiet_s=0.1)
    timer.join()
    assert time.perf_counter() - start >= 0.25
    assert len(lines) == 1 and lines[0].startswith("waiting for a DeepSpeed op build"), lines

    # a lock whose holder never lets go is removed once it is older than any build takes
    lines.clear()
    killed = _aged(tmp_path / "killed", 0)
    wait_for_build_locks([killed], lines.append, stale_s=0.3, poll_s=0.01, quiet_s=0)
    assert not killed.exists() and "waiting" in lines[0] and "removed a stale" in lines[1]


def test_a_rank_starts_past_a_lock_a_killed_start_left(tmp_path: Path) -> None:
    """A process killed while it held an op's build lock (torch takes it at every load) left
    it behind: the next rank's start removes it with one line instead of hanging forever."""
    ops = tmp_path / "torch_extensions"
    _run("from trainer.ds.ops import main; main()", DS_ACCELERATOR="cpu")
    shutil.copytree(Path(sys.prefix, "torch_extensions"), ops)
    lock = _aged(ops / "deepspeed_shm_comm" / "lock", 3600)
    code = "from trainer.dist import init_distributed; init_distributed('cpu'); print('started')"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "TORCH_EXTENSIONS_DIR": str(ops), "DS_ACCELERATOR": "cpu"},
    )  # fmt: skip
    assert proc.returncode == 0 and "started" in proc.stdout, proc.stderr[-2000:]
    assert f"paperscale: removed a stale DeepSpeed op build lock {lock}" in proc.stderr
    assert not lock.exists()


def test_the_venvs_ninja_builds_the_ops_whatever_path_holds(tmp_path: Path) -> None:
    """A shell with the venv activated (its ninja first on PATH) and one without (the
    system's) load the built op without rebuilding it: each process puts the venv's ninja
    first. Two ninja versions taking turns rebuilt it every time (their command hashes
    differ), ~25 s of CPU a start."""
    ops = tmp_path / "torch_extensions"
    _run("from trainer.ds.ops import main; main()", DS_ACCELERATOR="cpu")
    shutil.copytree(Path(sys.prefix, "torch_extensions"), ops)
    log = ops / "deepspeed_shm_comm" / ".ninja_log"
    before = log.read_text()
    venv_bin = str(Path(sys.prefix, "bin"))
    rest = [p for p in os.environ["PATH"].split(os.pathsep) if p and p != venv_bin]
    load = (
        "import os, trainer; from deepspeed.accelerator import get_accelerator; "
        "get_accelerator().create_op_builder('ShareMemCommBuilder').load(verbose=False); "
        "print(os.environ['PATH'].split(os.pathsep)[0])"
    )
    for path in (["/usr/bin", "/bin", *rest], [venv_bin, *rest], ["/usr/bin", "/bin"]):
        out = _run(load, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(ops), PATH=":".join(path))
        assert out.strip().splitlines()[-1] == venv_bin
    assert log.read_text() == before  # nothing was built again


REMEMBERED = """
import json, subprocess
from deepspeed.accelerator import get_accelerator
from trainer.ds.ops import remember_cpu_info
spawned = []
popen = subprocess.Popen.__init__
def counting(self, args, *rest, **kwargs):
    spawned.append(" ".join(map(str, args)))
    popen(self, args, *rest, **kwargs)
subprocess.Popen.__init__ = counting
builder = get_accelerator().create_op_builder("FusedAdamBuilder")
flags = lambda: [builder.cpu_arch(), builder.simd_width()]
asked = flags()
before = sum("cpuinfo" in s for s in spawned)
remember_cpu_info()
again = [flags() for _ in range(3)]
print(json.dumps({"asked": asked, "again": again, "before": before,
                  "after": sum("cpuinfo" in s for s in spawned) - before}))
"""


def test_deepspeed_asks_py_cpuinfo_once_per_machine_with_the_same_answer(tmp_path: Path) -> None:
    """DeepSpeed's CPU op builder runs a new interpreter for each question about the CPU
    (its compile flags, also for an op already built). Remembered, the first process asks once
    for all its questions and keeps the answer in the machine cache; the next asks none."""

    def ask() -> dict:
        out = subprocess.run(
            [sys.executable, "-c", REMEMBERED], cwd=ROOT, capture_output=True, text=True,
            env={**os.environ, "DS_ACCELERATOR": "cpu", "PAPERSCALE_CACHE_DIR": str(tmp_path)},
            timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.splitlines()[-1])

    first, second = ask(), ask()
    assert first["before"] == second["before"] == 2  # two questions, two interpreters
    assert first["after"] == 1  # six questions, one interpreter
    assert second["after"] == 0  # from the machine cache
    assert first["again"] == second["again"] == [first["asked"]] * 3


def test_the_cpu_info_key_follows_the_cpus_flags(tmp_path: Path) -> None:
    cpu = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2\n\nprocessor\t: 1\n"
    (tmp_path / "a").write_text(cpu)
    (tmp_path / "b").write_text(cpu.replace("avx2", "avx2 avx512f"))
    (tmp_path / "c").write_text("processor\t: 0\nmodel name\t: AMD EPYC\n")
    a, b = cpu_info_key(tmp_path / "a"), cpu_info_key(tmp_path / "b")
    assert a and b and a != b and a.startswith("py-cpuinfo ")
    assert cpu_info_key(tmp_path / "c") is None  # no flags: not kept
    assert cpu_info_key(tmp_path / "missing") is None
