"""DeepSpeed's JIT ops: kept in the venv, built ahead by `make venv` (trainer/ds/ops.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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


def test_ops_are_built_ahead_past_a_stale_lock() -> None:
    built = Path(sys.prefix, "torch_extensions")
    _run("from trainer.ds.ops import main; main()", DS_ACCELERATOR="cpu")
    lock = built / "fused_adam" / "lock"
    lock.touch()
    hours_ago = time.time() - 7200
    os.utime(lock, (hours_ago, hours_ago))  # a build killed two hours ago
    out = _run("from trainer.ds.ops import main; main()", DS_ACCELERATOR="cpu")
    assert "fused_adam: removed a stale build lock" in out and not lock.exists(), out
    assert "deepspeed_shm_comm: ready" in out and "fused_adam: ready" in out, out
    assert (built / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").is_file()
