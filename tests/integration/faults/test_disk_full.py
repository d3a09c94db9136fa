"""A checkpoint file system that fills up: the run stops with one clear line and exit 74, the
previous checkpoint stays `latest` and loads, and nothing half-written is left behind.

RUN/checkpoints is a real 1000 KiB tmpfs; one checkpoint of this run takes ~410 KiB, so the third
save does not fit. With the free-space check on, the save is refused before any file is written;
with it off (fault injection), the disk really fills in the middle of DeepSpeed's files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file

from launch.preflight import check_files_load
from tests.integration.faults.conftest import CONFIG, fault_env, overrides

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXIT_SAVE_FAILED = 74


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "run" / "checkpoints"
    mount_point.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1000k", "tmpfs", str(mount_point)], check=True
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


@pytest.mark.parametrize("space_check", [True, False], ids=["refused", "filled-mid-save"])
def test_full_disk_stops_cleanly(
    synthetic_data: Path, tmp_path: Path, small_disk: Path, space_check: bool
) -> None:
    run_dir = small_disk.parent
    env = fault_env() if space_check else fault_env(skip_space_check="1")
    args = overrides(synthetic_data, 6, "train.keep_last=5")
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "train", "--config", str(CONFIG), "--nproc", "2",
         "--run-dir", str(run_dir), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_SAVE_FAILED, out[-4000:]
    errors = [line for line in proc.stderr.splitlines() if "paperscale: error:" in line]
    assert len(errors) == 1, out[-4000:]
    line = errors[0]
    assert "step_00000003" in line and "last complete checkpoint is step_00000002" in line
    assert ("MiB free" in line) if space_check else ("No space left" in line), line
    assert "Traceback" not in out
    print(f"\n{line}")
    assert (small_disk / "latest").read_text().strip() == "step_00000002"
    assert sorted(p.name for p in small_disk.glob("step_*")) == ["step_00000001", "step_00000002"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == EXIT_SAVE_FAILED and summary["steps"] == 3
    check_files_load(small_disk / "step_00000002")  # every file reads, weights-only
    if not space_check:  # and DeepSpeed's consolidation reads the previous checkpoint
        out_dir = tmp_path / "export"
        done = subprocess.run(
            [sys.executable, "-m", "launch.cli", "export", str(run_dir), "--out", str(out_dir)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.strip().splitlines()[-1])["checkpoints"] == ["step_00000002"]
        assert all(t.isfinite().all() for t in load_file(out_dir / "model.safetensors").values())
