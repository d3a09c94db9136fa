"""Restart in place, by `paperscale train` itself: SIGKILL of one rank at 3 different steps of
a 2-rank run costs 3 restarts of the worker group (train.max_restarts, default 3) and nothing
else: no command typed, the per-step losses and the final weights equal an uninterrupted
run's bitwise (no sample lost or repeated, RNG and optimizer state restored), in bf16 and fp32.
The same failure again and again at the same step is a crash loop: stopped, exit 70."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.integration.conftest import paperscale
from tests.integration.faults.conftest import (
    CONFIG,
    STEPS,
    fault_env,
    losses,
    overrides,
    resumed_steps,
)
from trainer.attempts import EXIT_CRASH_LOOP, read_attempts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KILL_AT = [3, 6, 9]  # rank 1 dies right after these steps, before logging or saving them


def train(run_dir: Path, over: list[str], env: dict[str, str] | None = None) -> str:
    proc = paperscale(
        "train", "--config", str(CONFIG), "--nproc", "2", "--run-dir", str(run_dir), *over,
        cwd=run_dir.parent, env=env, timeout=480,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    (run_dir.parent / f"{run_dir.name}.log").write_text(out)
    assert proc.returncode == 0, out[-4000:]
    return out


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = (
        load_file(str(a / "model/model.safetensors")),
        load_file(str(b / "model/model.safetensors")),
    )
    return wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_kills_are_restarted_in_place_with_identical_losses_and_weights(
    synthetic_data: Path, reference_run: Path, tmp_path: Path, precision: str
) -> None:
    over = overrides(synthetic_data, STEPS, "train.save_every=2", f"train.precision={precision}")
    reference = reference_run
    if precision == "fp32":  # the session's reference run is bf16
        reference = tmp_path / "straight"
        train(reference, over)
    run_dir = tmp_path / "killed"
    out = train(run_dir, over, fault_env(rank="1", kill_at_step=",".join(map(str, KILL_AT))))
    assert out.count("fault injected: rank 1 SIGKILL after step") == len(KILL_AT)
    # saves every 2 steps: a kill after step k resumes from the last even step before it
    assert resumed_steps(out) == [k - 1 if k % 2 else k - 2 for k in KILL_AT]
    for k in range(1, len(KILL_AT) + 1):
        assert f"attempt {k + 1}: the worker group restarted in place (restart {k} of " in out
    got, want = losses(run_dir), losses(reference)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == [want[s] for s in sorted(want)]  # bitwise
    assert same_weights(run_dir, reference)
    attempts = read_attempts(run_dir / "attempts.jsonl")
    assert len(attempts) == 4 and attempts[-1].ended and not any(a.ended for a in attempts[:-1])
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("attempt", 0) for r in records) == len(KILL_AT)
    # torchrun's records of the four attempts, kept with the run (not in /tmp)
    (torchrun_run,) = (run_dir / "logs/torchrun").iterdir()
    assert sorted(p.name for p in torchrun_run.iterdir()) == [f"attempt_{k}" for k in range(4)]


def test_the_same_failure_again_and_again_is_a_crash_loop(
    synthetic_data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "loop"
    over = overrides(
        synthetic_data, STEPS, "train.save_every=2", "train.max_restarts=6",
        "train.crash_loop_attempts=3",
    )  # fmt: skip
    env = fault_env(rank="1", kill_at_step="5,5,5,5,5,5,5")
    proc = paperscale(
        "train", "--config", str(CONFIG), "--nproc", "2", "--run-dir", str(run_dir), *over,
        cwd=tmp_path, env=env, timeout=480,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_CRASH_LOOP, out[-4000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("paperscale: error: crash loop")]
    assert len(lines) == 1, out[-4000:]
    assert "the last 3 attempts resumed from checkpoint step_00000004 and failed" in lines[0]
    assert "train.crash_loop_attempts=3" in lines[0]
    # the first attempt from scratch, three from step 4, then the one that stopped: no more
    assert out.count("fault injected: rank 1 SIGKILL after step 5") == 4
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == EXIT_CRASH_LOOP and summary["error"].startswith("crash loop")


def test_a_hung_rank_becomes_a_restart(
    synthetic_data: Path, reference_run: Path, tmp_path: Path
) -> None:
    """Rank 1 hangs after step 3, between the step and its logging collective: rank 0's
    collective times out after train.dist_timeout_s and rank 1's watchdog prints its stack and
    ends it; torchrun restarts the group, which resumes from step 2's checkpoint (the hang comes
    before step 3's save) and finishes by itself with an uninterrupted run's losses. The
    restarted attempt reports where the stuck rank was, and the record holds it."""
    over = overrides(synthetic_data, STEPS, "train.dist_timeout_s=15")
    run_dir = tmp_path / "hung"
    out = train(run_dir, over, fault_env(rank="1", hang_at_step="3"))
    assert out.count("fault injected: rank 1 hanging after step 3") == 1
    assert "attempt 2: the worker group restarted in place (restart 1 of " in out
    assert resumed_steps(out) == [2]
    got, want = losses(run_dir), losses(reference_run)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == [want[s] for s in sorted(want)]  # bitwise
    attempts = read_attempts(run_dir / "attempts.jsonl")
    assert len(attempts) == 2 and attempts[-1].ended, attempts
    # the stuck rank and where it waited, reported by the restarted attempt (rank 0 may have
    # left through its collective's timeout or its own watchdog: either is recorded)
    stuck = [x for x in out.splitlines() if x.startswith("paperscale: watchdog: rank 1 ")]
    assert len(stuck) == 1 and "step_ended at " in stuck[0] and "trainer/faults.py" in stuck[0]
    assert attempts[0].error is not None, attempts[0]
