"""SIGKILL inside a checkpoint save, at every file boundary.

Rank 0 writes, in order: DeepSpeed's model states (1), its optimizer partition (2), its own
rank state (3), then meta.json (4), the `complete` marker (5) and `latest` (6); rank 1 writes its
optimizer partition and its rank state. One 2-rank run under torchrun --max-restarts is killed
once in each attempt, in the save of a later step each time. After each kill the restarted ranks
must resume from the previous checkpoint (or from the new one when `latest` was already
written), save the interrupted tag again, and in the end have logged exactly the losses of an
uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.faults.conftest import (
    STEPS,
    fault_env,
    losses,
    overrides,
    resumed_steps,
    torchrun_with_restarts,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(500)]

# (step whose save is interrupted, files this rank wrote before the kill, rank)
KILLS = [(2, 0, 0), (3, 1, 0), (4, 2, 0), (5, 3, 0), (6, 4, 0), (7, 5, 0), (8, 6, 0), (9, 1, 1)]
LATEST_WRITTEN = 6  # rank 0's 6th file is `latest`: that save counts as done
# the async path: each background file of each rank, and the publication's first and last
ASYNC_KILLS = [(2, 1, 0), (3, 2, 0), (4, 3, 0), (5, 4, 0), (6, 6, 0), (7, 1, 1)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_at_every_file_boundary_of_a_save(
    synthetic_data: Path, reference_run: Path, tmp_path: Path, mode: str
) -> None:
    """`async`: train.async_save, where the engine's and the rank's files are written by a
    background thread while the next step trains, and rank 0 publishes (meta.json, complete,
    latest) at a later step: a kill at each of those files, the same outcome."""
    run_dir = tmp_path / "saves"
    kills = ASYNC_KILLS if mode == "async" else KILLS
    env = fault_env(kill_in_save=",".join(f"{s}:{f}:{r}" for s, f, r in kills))
    over = overrides(synthetic_data, STEPS, f"train.async_save={str(mode == 'async').lower()}")
    proc = torchrun_with_restarts(run_dir, over, len(kills), env, 450)
    out = proc.stdout + proc.stderr
    (tmp_path / "saves.log").write_text(out)
    assert proc.returncode == 0, out[-4000:]
    assert f"async_save: {str(mode == 'async').lower()}" in (run_dir / "config.yaml").read_text()
    assert out.count("fault injected:") == len(kills)
    # the interrupted checkpoint is never the one resumed from
    want = [s if (f == LATEST_WRITTEN and r == 0) else s - 1 for s, f, r in kills]
    assert resumed_steps(out) == want
    # every interrupted tag was saved again: no directory without its marker is left
    ckpt_dir = run_dir / "checkpoints"
    tags = sorted(p.name for p in ckpt_dir.glob("step_*"))
    assert tags == [f"step_{s:08d}" for s in (STEPS - 2, STEPS - 1, STEPS)]
    assert all((ckpt_dir / t / "complete").is_file() for t in tags)
    assert (ckpt_dir / "latest").read_text().strip() == f"step_{STEPS:08d}"
    got, ref = losses(run_dir), losses(reference_run)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == [ref[s] for s in sorted(ref)]  # bitwise
