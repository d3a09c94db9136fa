"""The study harness (bench/study.py) without training runs: every study in configs/bench/
loads at both sizes, a wrong one is refused in one line, each reducer on made-up records, the
comparisons and goals. The runs themselves are test_bench_suite.py's smoke runs."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from bench import registry, study
from bench.common import SMOKE_MODEL, missed_goals

ROOT = Path(__file__).resolve().parents[2]
STUDIES = [
    ROOT / b.full["path"] for b in registry.REGISTRY.values() if b.measure == "study:run_study"
]

# four logged steps, one second apart but the third (a save) three; an evaluation record
RECORDS = [
    {"step": 1, "time": 100.0, "loss": 5.0, "tokens_per_s": 10.0},
    {"step": 2, "time": 101.0, "loss": 4.0, "tokens_per_s": 20.0},
    {"step": 3, "time": 104.0, "loss": 3.0, "tokens_per_s": 40.0},
    {"step": 3, "valid_ppl": math.e**2, "bleu": 7.5},
    {"step": 4, "time": 105.0, "loss": 2.0, "tokens_per_s": 30.0},
]


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_every_study_loads_at_both_sizes(path: Path) -> None:
    full, smoke = study.load_study(path, smoke=False), study.load_study(path, smoke=True)
    assert full.arms and set(smoke.arms) <= set(full.arms)
    assert list(smoke.train[: len(full.train)]) == list(full.train)  # the smoke model after
    assert all(o in smoke.train for o in SMOKE_MODEL)
    assert (ROOT / full.config).is_file()


def test_a_study_without_arms_or_with_an_unknown_reduce_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("config: configs/tiny.yaml\ndata: {synthetic: 10}\nfigures: []\n")
    with pytest.raises(ValueError, match="a study needs `arms`"):
        study.load_study(bad, smoke=False)
    bad.write_text(
        "config: configs/tiny.yaml\ndata: {synthetic: 10}\narms: {a: {}}\n"
        "figures: [{name: x, reduce: fastest, unit: s}]\n"
    )
    with pytest.raises(ValueError, match="unknown reduce 'fastest'"):
        study.load_study(bad, smoke=False)
    with pytest.raises(ValueError, match="unknown reduce 'fastest'"):
        study.run_study(tmp_path / "w", str(bad))  # before any run
    bad.write_text(
        "config: configs/tiny.yaml\ndata: {synthetic: 10}\narms: {a: {}, b: {}}\n"
        "figures: [{name: x, reduce: mean, unit: s}]\n"
        "compare: [{name: a / b, figure: y, op: ratio, arms: [a, b]}]\n"
    )
    with pytest.raises(ValueError, match="one of its figures and two of its arms"):
        study.load_study(bad, smoke=False)  # a typo found before hours of runs


@pytest.mark.parametrize(
    ("reduce", "metric", "expected"),
    [
        ("mean", "tokens_per_s", 30.0),  # the first log window (start-up) left out
        ("median", "tokens_per_s", 30.0),
        ("last", "bleu", 7.5),
        ("last_log", "valid_ppl", 2.0),
        ("max", "step", 4),
        ("steps_seconds", "", 5.0),
        ("median_step", "", 1.0),
        ("command_seconds", "", 12.0),
        ("outside_steps", "", 7.0),
        ("last", "valid_loss", math.nan),  # not logged: null in the rows
    ],
)
def test_each_reducer_on_made_up_records(reduce: str, metric: str, expected: float) -> None:
    value = study.REDUCERS[reduce](RECORDS, metric, 12.0)
    assert value == pytest.approx(expected, nan_ok=True)


def test_the_excess_over_median_steps_shows_a_slow_step() -> None:
    steps = [{"step": i, "time": float(i), "loss": 1.0} for i in range(1, 22)]
    flat = study.REDUCERS["excess_pct"](steps, "", 0.0)
    steps[15:] = [{**r, "time": r["time"] + 2.0} for r in steps[15:]]  # one step 3 s
    assert flat == pytest.approx(0.0)
    assert study.REDUCERS["excess_pct"](steps, "", 0.0) == pytest.approx(
        100 * 2 / 18
    )  # 20 steps, the first 2 out


def test_comparisons_and_goals(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "config: configs/tiny.yaml\ndata: {synthetic: 10}\narms: {a: {}, b: {}}\n"
        "figures: [{name: '{arm} speed', reduce: mean, metric: x, unit: t/s, goal: '>= 2'}]\n"
        "compare: [{name: a / b, figure: '{arm} speed', op: ratio, arms: [a, b], goal: '<= 1'}]\n"
    )
    s = study.load_study(path, smoke=False)
    rows = study.study_rows(s, {"a": {"{arm} speed": 3.0}, "b": {"{arm} speed": 1.5}})
    assert [(r["figure"], r["value"]) for r in rows] == [
        ("a speed", 3.0), ("b speed", 1.5), ("a / b", 2.0)
    ]  # fmt: skip
    assert missed_goals(rows) == ["b speed 1.5 (goal >= 2)", "a / b 2 (goal <= 1)"]


def test_an_arm_with_a_checkout_runs_from_a_worktree_of_that_revision(tmp_path: Path) -> None:
    path = study.worktree("HEAD", tmp_path)
    try:
        assert (path / "configs" / "tiny.yaml").is_file()
        assert study.worktree("HEAD", tmp_path) == path  # made once
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)])


def test_a_profiled_run_gives_its_groups_and_an_unprofiled_one_nothing(tmp_path: Path) -> None:
    assert study.profile_record(tmp_path) == {}
    table = tmp_path / "profile" / "step_60" / "rank_00000.groups.json"
    table.parent.mkdir(parents=True)
    table.write_text('{"step_ms": 700.0, "groups_ms": {"matmul": 240.0, "loss": 70.0}}')
    record = study.profile_record(tmp_path)
    assert record["profile step ms"] == 700.0 and record["profile matmul ms"] == 240.0
    assert study.REDUCERS["last"]([record], "profile loss ms", 0.0) == 70.0


def test_steps_and_seconds_to_the_target_arms_final_nll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study with a `target` arm: every run of the round is told the valid nll that arm ended
    at; the steps and the training seconds (tokens over tokens/s of each logged step) to the
    first evaluation at or below it; NaN for a run that never got there."""

    def run(nlls: list[float], tokens_per_s: float) -> list[dict]:
        out = []
        for step, nll in enumerate(nlls, 1):
            out.append(
                {"step": step, "tgt_tokens_per_step": 100.0, "tgt_tokens_per_s": tokens_per_s}
            )
            out.append({"step": step, "valid_ppl": math.exp(nll)})
        return out

    runs = {"B": (run([5.0, 4.0, 3.0], 100.0), 9.0), "2B": (run([4.5, 2.9, 2.8], 50.0), 9.0),
            "slow": (run([6.0, 5.0, 4.0], 10.0), 9.0)}  # fmt: skip
    monkeypatch.setattr(study, "run_arm", lambda s, name, d, w, k: runs[name])
    path = tmp_path / "s.yaml"
    path.write_text(
        "config: configs/tiny.yaml\ndata: {synthetic: 10}\narms: {B: {}, 2B: {}, slow: {}}\n"
        "target: B\nfigures: [{name: steps, reduce: steps_to_target, unit: steps},\n"
        "  {name: seconds, reduce: seconds_to_target, unit: s}]\n"
    )
    values = study.measure(study.load_study(path, smoke=False), tmp_path, tmp_path)
    assert values["B"] == {"steps": 3, "seconds": pytest.approx(3.0)}
    assert values["2B"] == {"steps": 2, "seconds": pytest.approx(4.0)}
    assert math.isnan(values["slow"]["steps"]) and math.isnan(values["slow"]["seconds"])
    path.write_text(path.read_text().replace("target: B", "target: C"))
    with pytest.raises(ValueError, match="target 'C' is none of its arms"):
        study.load_study(path, smoke=False)
    path.write_text(path.read_text().replace("target: C", "target: B\nsmoke: {arms: [2B]}"))
    study.load_study(path, smoke=False)
    with pytest.raises(ValueError, match="target 'B' is none of its arms"):
        study.load_study(path, smoke=True)  # a smoke that keeps the target arm out
    path.write_text(path.read_text().replace("target: B\n", ""))
    with pytest.raises(ValueError, match="`target` go together"):
        study.load_study(path, smoke=False)
