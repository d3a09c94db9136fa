"""A study: `paperscale train` runs side by side, declared in `configs/bench/NAME.yaml` and read
from each run's own metrics.jsonl. The training speed benches are studies.

A study names a training config, its data, the overrides every run takes (`train`), its arms
(each: overrides, environment, ranks, a git `checkout`) and how many rounds to run them in
turn (so that the machine's load drifts equally on every arm). Every arm is a fresh run. Each
figure reduces one run's records to a number (`reduce`), averaged over the rounds; a
comparison divides or subtracts two arms' values of a figure; a `target` arm's final valid nll
is what `steps_to_target` and `seconds_to_target` measure each run of its round against.
`evaluate` adds `paperscale evaluate` of each run on the test split at the listed beams
(`test_bleu_beam<N>`). `smoke` replaces `rounds`, `data`, `context`, `evaluate` and the arms
kept, and appends its `train` after the smoke-size model and SMOKE_READER (no loader worker).
"""

from __future__ import annotations

import json
import math
import operator
import resource
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bench.common import (
    CLI,
    GOALS,
    ROOT,
    SMOKE_MODEL,
    SMOKE_READER,
    BenchInputError,
    Row,
    prepare_synthetic,
    row,
    run_command,
    train_run,
)

Records = list[dict[str, Any]]


def _logged(records: Records, metric: str) -> list[float]:
    """The metric's values in the run's log records after the first (which holds start-up)."""
    return [r[metric] for r in records if metric in r][1:]


def _step_seconds(records: Records) -> list[float]:
    """Each step's wall seconds, from consecutive logged steps (the study logs every step)."""
    times = {r["step"]: r["time"] for r in records if "loss" in r}
    first, last = min(times), max(times)
    return [times[i] - times[i - 1] for i in range(first + 1, last + 1) if i - 1 in times]


def _excess_pct(records: Records) -> float:
    """The steps' time over as many median steps, in % (the first tenth left out); a save lands
    in a few steps, the median step is one without."""
    steps = _step_seconds(records)
    steps = steps[max(len(steps) // 10, 1) :]
    return 100 * (sum(steps) / (len(steps) * statistics.median(steps)) - 1.0)


def _of(values: list[float], how: Callable[[list[float]], float]) -> float:
    """`how` of the values; NaN when the run logged none."""
    return how(values) if values else math.nan


def _all(records: Records, metric: str) -> list[float]:
    return [r[metric] for r in records if metric in r]


def _to_target(records: Records) -> tuple[float, float]:
    """(step, training seconds) of the run's first evaluation at or below the round's target
    nll; a logged step's training seconds are its tokens over its tokens/s (every step logged,
    evaluations left out); NaNs when it never got there."""
    target = next(r["target_nll"] for r in records if "target_nll" in r)
    seconds = 0.0
    for r in records:
        if "tgt_tokens_per_s" in r:
            seconds += r["tgt_tokens_per_step"] / r["tgt_tokens_per_s"]
        if "valid_ppl" in r and math.log(r["valid_ppl"]) <= target:
            return r["step"], seconds
    return math.nan, math.nan


# reduce: one run's records (and the train command's wall seconds) -> a number
REDUCERS: dict[str, Callable[[Records, str, float], float]] = {
    "mean": lambda rs, m, s: _of(_logged(rs, m), statistics.mean),
    "median": lambda rs, m, s: _of(_logged(rs, m), statistics.median),
    "last": lambda rs, m, s: _of(_all(rs, m), lambda v: v[-1]),
    "last_log": lambda rs, m, s: _of(_all(rs, m), lambda v: math.log(v[-1])),  # nll from ppl
    "max": lambda rs, m, s: _of(_all(rs, m), max),
    "steps_seconds": lambda rs, m, s: sum(_step_seconds(rs)),
    "median_step": lambda rs, m, s: statistics.median(_step_seconds(rs)),
    "excess_pct": lambda rs, m, s: _excess_pct(rs),
    "command_seconds": lambda rs, m, s: s,
    "outside_steps": lambda rs, m, s: s - sum(_step_seconds(rs)),
    "steps_to_target": lambda rs, m, s: _to_target(rs)[0],
    "seconds_to_target": lambda rs, m, s: _to_target(rs)[1],
}
COMPARISONS = {"ratio": operator.truediv, "difference": operator.sub}


def load_study(path: Path, smoke: bool) -> Any:
    """The study at `path`, at smoke size when asked; BenchInputError naming what is wrong."""
    study = OmegaConf.load(path)
    for key in ("config", "data", "arms", "figures"):
        if key not in study:
            raise BenchInputError(f"{path}: a study needs `{key}`")
    for fig in study.figures:
        if fig.get("reduce", "mean") not in REDUCERS:
            known = sorted(REDUCERS)
            raise BenchInputError(f"{path}: unknown reduce {fig.reduce!r}; known: {known}")
    if any(f.get("reduce", "").endswith("_to_target") for f in study.figures) != (
        "target" in study
    ):
        raise BenchInputError(f"{path}: figures `..._to_target` and `target` go together")
    names = {fig.name for fig in study.figures}
    for cmp in study.get("compare", []):
        arms_ok = len(cmp.arms) == 2 and all(a in study.arms for a in cmp.arms)
        if cmp.op not in COMPARISONS or cmp.figure not in names or not arms_ok:
            ops = sorted(COMPARISONS)
            raise BenchInputError(f"{path}: comparison {cmp.name!r} needs an op in {ops}, one "
                                  "of its figures and two of its arms")  # fmt: skip
    for item in [*study.figures, *study.get("compare", [])]:
        if "goal" in item and str(item.goal).split()[0] not in GOALS:
            forms = "'>= N' or '<= N'"
            raise BenchInputError(f"{path}: goal {item.goal!r} of {item.name!r}: {forms}")
    train = list(study.get("train", []))
    if smoke:
        small = study.get("smoke", {})
        train += [*SMOKE_MODEL, SMOKE_READER, *small.get("train", [])]
        study.rounds = small.get("rounds", 1)
        study.data = small.get("data", {"synthetic": 2000})
        study.context = {**study.get("context", {}), **small.get("context", {})}
        study.evaluate = small.get("evaluate", study.get("evaluate", []))
        keep = small.get("arms", list(study.arms))
        study.arms = {name: arm for name, arm in study.arms.items() if name in keep}
        study.compare = [c for c in study.get("compare", []) if set(c.arms) <= set(keep)]
    if study.get("target", None) not in (None, *study.arms):  # (the smoke's arms kept too)
        raise BenchInputError(f"{path}: target {study.target!r} is none of its arms")
    study.train = train
    return study


def prepare_data(spec: Any, work: Path) -> Path:
    """A prepared data dir: `dir`, or a synthetic corpus of `synthetic` training pairs."""
    if "dir" in spec:
        return (ROOT / spec.dir).resolve()
    extra = {"corpus_args": [str(a) for a in spec.get("corpus", [])]}
    if "prepare" in spec:
        extra["prepare_args"] = [str(a) for a in spec.prepare]
    return prepare_synthetic(work, int(spec.synthetic), **extra)


def evaluate(run_dir: Path, data: Path, beam: int) -> float:
    """Test BLEU of the run's model at `beam` (`paperscale evaluate`'s JSON line)."""
    log = run_dir.with_name(f"{run_dir.name}.evaluate{beam}.log")
    cmd = [*CLI, "evaluate", str(run_dir), "--data", str(data), "--split", "test"]
    run_command([*cmd, "--beam", str(beam)], log=log)
    lines = [x for x in log.read_text().splitlines() if x.startswith("{")]
    return float(json.loads(lines[-1])["bleu"])


def worktree(rev: str, work: Path) -> Path:
    """A checkout of git revision `rev` under `work` (made once)."""
    path = work / f"rev-{rev}"
    if not path.is_dir():
        cmd = ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev]
        subprocess.run(cmd, check=True, capture_output=True)
    return path


def profile_record(run_dir: Path) -> dict[str, Any]:
    """The last profiled window's grouped step time (rank 0) as `profile <group> ms` and
    `profile step ms` records; {} when the run was not profiled."""
    tables = sorted(run_dir.glob("profile/*/rank_00000.groups.json"))
    if not tables:
        return {}
    groups = json.loads(tables[-1].read_text())
    out = {f"profile {g} ms": ms for g, ms in groups["groups_ms"].items()}
    return {"step": -1, "profile step ms": groups["step_ms"], **out}


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_arm(study: Any, name: str, data: Path, work: Path, k: int) -> tuple[Records, float]:
    """One fresh run of arm `name` (round `k`), with the study's overrides but those starting
    with one of its `without`; its records (with the profile's and the test BLEUs) and seconds."""
    arm = study.arms[name] or {}
    run_dir = work / f"{name.replace(' ', '_').replace('/', '_')}-{k}"
    drop = tuple(arm.get("without", []))
    common = [o for o in study.train if not (drop and o.startswith(drop))]
    over = [f"data.dir={data}", *common, *arm.get("train", [])]
    env = {str(key): str(value) for key, value in arm.get("env", {}).items()}
    root = worktree(arm.checkout, work) if "checkout" in arm else ROOT
    started, cpu = time.perf_counter(), children_cpu_s()
    records, seconds = train_run(
        root / study.config, run_dir, over, nproc=int(arm.get("nproc", 2)), env=env,
        timeout=float(study.get("timeout", 3600)), log=run_dir.with_suffix(".log"), cwd=root,
    )  # fmt: skip
    # CPU seconds of the command and every process it waited for (torchrun, the ranks)
    records.append({"step": -1, "command_cpu_s": children_cpu_s() - cpu})
    records.append(profile_record(run_dir) or {"step": -1})
    for beam in study.get("evaluate", []):
        records.append({"step": -1, f"test_bleu_beam{beam}": evaluate(run_dir, data, beam)})
    print(f"{name} (round {k}): {time.perf_counter() - started:.1f} s", flush=True)
    return records, seconds


def measure(study: Any, data: Path, work: Path) -> dict[str, dict[str, float]]:
    """Every figure of every arm, the mean over the rounds (arms in turn, reversed in odd
    rounds). With a `target` arm, each round's
    runs know the valid nll it ended at (`target_nll`)."""
    values: dict[str, dict[str, list[float]]] = {a: {} for a in study.arms}
    for k in range(int(study.get("rounds", 1))):
        # odd rounds in the reverse order: a machine that drifts slower or faster over the
        # study favours no arm by its place
        order = list(study.arms) if k % 2 == 0 else list(study.arms)[::-1]
        runs = {name: run_arm(study, name, data, work, k) for name in order}
        if "target" in study:
            nll = REDUCERS["last_log"](runs[study.target][0], "valid_ppl", 0.0)
            for records, _ in runs.values():
                records.append({"step": -1, "target_nll": nll})
        for name, (records, seconds) in runs.items():
            for fig in study.figures:
                reduce = REDUCERS[fig.get("reduce", "mean")]
                value = reduce(records, fig.get("metric", ""), seconds)
                values[name].setdefault(fig.name, []).append(value)
    return {a: {f: statistics.mean(v) for f, v in figs.items()} for a, figs in values.items()}


def study_rows(study: Any, values: dict[str, dict[str, float]]) -> list[Row]:
    """The figures of every arm, then the comparisons, as rows."""
    case = {"config": str(study.config), "rounds": int(study.get("rounds", 1))}
    case |= dict(study.get("context", {}))
    rows = []
    for name, figs in values.items():
        for fig in study.figures:
            extra = {"goal": fig.goal} if "goal" in fig else {}
            label = fig.name.format(arm=name)
            rows.append(row(label, figs[fig.name], fig.unit, arm=name, **extra, **case))
    for cmp in study.get("compare", []):
        a, b = (values[arm][cmp.figure] for arm in cmp.arms)
        extra = {"goal": cmp.goal} if "goal" in cmp else {}
        rows.append(row(cmp.name, COMPARISONS[cmp.op](a, b), cmp.get("unit", "x"), **extra, **case))
    return rows


def run_study(work: Path, path: str, smoke: bool = False) -> list[Row]:
    """The study at `path` (configs/bench/NAME.yaml): its arms' runs under `work`, its rows."""
    study = load_study(Path(path), smoke)
    return study_rows(study, measure(study, prepare_data(study.data, work), work))
