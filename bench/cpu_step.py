"""The demo preset's training step on 2 CPU ranks: target tokens/s, MFU and where the step's
time went, for the defaults and with each speed choice undone, side by side in one sitting.

    .venv/bin/python -m bench.cpu_step --work /tmp/bench-cpu-step [--data data/debian-ende] \\
        [--config configs/tiny.yaml] [--steps 60] [--repeats 2] [--before REV] [--smoke] \\
        [--json PATH]

Every variant is a real `paperscale train --nproc 2` of the preset for --steps steps, logged
every 10, and all variants run in turn, --repeats rounds; a variant's speed is the median
target tokens/s of its log windows after the first (the same batches in every variant: same
seed and data), and its ratio to the defaults is the median of the window-by-window ratios
within each round. The last steps are profiled (`profile.enabled`), and
the grouped table of the defaults (and of --before) is kept. Variants:

- defaults (bf16 where native), and fp32;
- each choice undone alone: torch's own attention kernel (`train.attention=default`), Adam's
  per-tensor loop (`optim.fused=false`), ZeRO stage 2 instead of the preset's;
- with --before REV: the code of git revision REV (a worktree under --work), in the same
  precision as the defaults: the step before all of these choices.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bench.common import ROOT, SMOKE_MODEL, Row, add_output_arguments, row, train_run, write_rows
from trainer.run_dir import RunDir
from trainer.step_time import GROUPS

LOG_EVERY = 10


def variants(smoke: bool) -> dict[str, tuple[list[str], dict[str, str | None]]]:
    """name -> (overrides, environment changes; None removes a variable)."""
    out: dict[str, tuple[list[str], dict[str, str | None]]] = {
        "defaults": ([], {}),
        "fp32": (["train.precision=fp32"], {}),
    }
    if smoke:
        return out
    out |= {
        "torch's attention kernel": (["train.attention=default"], {}),
        "unfused Adam": (["optim.fused=false"], {}),
        "ZeRO stage 2": (["train.zero_stage=2"], {}),  # the preset has 1
    }
    return out


def train(
    root: Path, config: str, data: Path, run_dir: Path, steps: int, extra: list[str],
    env_changes: dict[str, str | None], smoke: bool,
) -> dict[str, Any]:  # fmt: skip
    """One run of `paperscale train` from the checkout at `root`; its log windows and profile.
    A new run each time (a run dir left from before would resume)."""
    # 4 steps recorded after 1 warm-up, ending a step before the last (whose interval would
    # hold the final evaluation and export)
    wait = max(steps - 6, 0)
    over = [
        f"data.dir={data}", f"train.max_steps={steps}",
        f"train.log_every={LOG_EVERY if not smoke else 2}", "train.eval_every=0",
        "train.save_every=0", "train.bleu_samples=4", *(SMOKE_MODEL if smoke else []), *extra,
    ]  # fmt: skip
    if (root / "trainer" / "profiler.py").is_file():  # not in older revisions
        over += [
            "profile.enabled=true", f"profile.wait_steps={wait}", "profile.warmup_steps=1",
            f"profile.steps={max(steps - wait - 2, 1)}",
        ]  # fmt: skip
    log = run_dir.with_suffix(".log")
    records, _ = train_run(root / config, run_dir, over, env=env_changes, log=log, cwd=root)
    windows = [r for r in records if "tgt_tokens_per_s" in r][1:]
    tables = sorted(run_dir.glob("profile/*/rank_00000.groups.json"))
    settled = OmegaConf.load(RunDir(run_dir).config)
    return {
        "precision": str(settled.train.precision),
        "tokens": [r["tgt_tokens_per_s"] for r in windows],
        "mfu": statistics.median([r.get("mfu", 0.0) for r in windows]) if windows else 0.0,
        "groups": json.loads(tables[-1].read_text()) if tables else None,
    }


def worktree(rev: str, work: Path) -> Path:
    """A checkout of `rev` under `work` (made once)."""
    path = work / f"rev-{rev}"
    if not path.is_dir():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
            check=True, capture_output=True,
        )  # fmt: skip
    return path


def figures(name: str, run: dict[str, Any], base: dict[str, Any]) -> list[Row]:
    ctx = {"variant": name, "precision": run["precision"]}
    rows = [
        row(f"{name}: target tokens/s", statistics.median(run["tokens"]), "tokens/s", **ctx),
        row(f"{name}: MFU", run["mfu"], "", **ctx),
    ]
    if run is not base:
        pairs = [
            a / b
            for mine, theirs in zip(run["rounds"], base["rounds"], strict=True)
            for a, b in zip(mine, theirs, strict=False)
        ]  # window by window, within each round
        ratio = statistics.median(pairs)
        rows.append(row(f"{name}: speed against the defaults", ratio, "x", **ctx))
    groups = run["groups"]
    if groups and name in ("defaults", "before"):
        step = groups["step_ms"]
        for group in GROUPS:
            ms = groups["groups_ms"].get(group, 0.0)
            rows.append(row(f"{name}: {group}", ms, "ms/step", share_pct=100 * ms / step, **ctx))
        rows.append(row(f"{name}: step (profiled, rank 0)", step, "ms/step", **ctx))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--data", type=Path, help="prepared data (default: a synthetic corpus)")
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=2, help="rounds of all variants, in turn")
    p.add_argument("--before", help="a git revision to measure beside the defaults")
    add_output_arguments(p, "a synthetic corpus, the smoke model, 6 steps, two variants")
    args = p.parse_args()
    from bench.common import prepare_synthetic

    args.work.mkdir(parents=True, exist_ok=True)
    data = (args.data or prepare_synthetic(args.work, 2000 if args.smoke else 20000)).resolve()
    steps = 6 if args.smoke else args.steps
    cases, root = dict(variants(args.smoke)), ROOT
    if args.before:
        root = worktree(args.before, args.work)
        cases["before"] = ([], {})
    runs: dict[str, dict[str, Any]] = {}
    for _ in range(1 if args.smoke else args.repeats):  # in turn, so that drift hits all alike
        for name, (extra, env) in cases.items():
            where = root if name == "before" else ROOT
            one = train(
                where, args.config, data, args.work / name.replace(" ", "_"), steps, extra,
                env, args.smoke,
            )  # fmt: skip
            runs.setdefault(name, {**one, "tokens": [], "rounds": []})
            runs[name]["tokens"] += one["tokens"]
            runs[name]["rounds"].append(one["tokens"])
            runs[name]["groups"] = runs[name]["groups"] or one["groups"]
    rows = [r for name, run in runs.items() for r in figures(name, run, runs["defaults"])]
    fp32 = statistics.median(runs["fp32"]["tokens"])
    rows.append(row("defaults : fp32", statistics.median(runs["defaults"]["tokens"]) / fp32, "x"))
    for r in rows:
        print(f"{r['figure']:<52} {r['value']:12.4g} {r['unit']}")
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
