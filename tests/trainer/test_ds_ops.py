"""DeepSpeed's JIT ops: kept in the venv, built ahead by `make venv` (trainer/ds_ops.py)."""

from __future__ import annotations

import os
import subprocess
import sys
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


def test_ops_are_built_ahead() -> None:
    out = _run("from trainer.ds_ops import main; main()", DS_ACCELERATOR="cpu")
    assert "deepspeed_shm_comm: ready" in out and "fused_adam: ready" in out, out
    built = Path(sys.prefix, "torch_extensions")
    assert (built / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").is_file()
