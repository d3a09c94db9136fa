"""paperscale against fairseq on the same data, model, recipe and machine, in one sitting.
fairseq runs in a venv of its own (`make fairseq-venv`); without it only our halves run.

1. Side by side, per corpus: the same pairs, pieces and order (fairseq's dictionary is our
   sentencepiece vocabulary); `paperscale train` of the preset (2 ranks; fp32, and in `auto`'s
   precision) and `fairseq-train` of the same model and recipe (one process, 2 threads,
   --update-freq = ranks x accumulation), the same steps each, one after the other. Figures:
   training nll at the middle and last step, validation nll at the last, target tokens/s by
   each side's own meter (median of the windows after the warm-up) and over the job (launch to
   exit), target tokens per step; and paperscale against fairseq.
2. Lockstep: the same initial weights, micro-batches, dropout 0, sinusoidal table and learning
   rates in our recipe as a bare loop (bench/recipe.py) and in fairseq's model, criterion, Adam
   and schedule (bench/fairseq_worker.py): the largest relative difference of the per-step
   losses, and the speed of the two loops, one thread each.
3. Initialisation: the same micro-batches with dropout from our init, fairseq's (mapped) and
   the xavier init we used before: training nll over the last 10 steps of the bare loop.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import bench.recipe as recipe
from bench.common import CLI, Row, prepare_synthetic, row, run_command, train_run

WORLD = 2  # paperscale ranks; fairseq: one process with as many threads
LOG_EVERY = 20
SMOKE_PREPARE = ("--vocab-size", "96", "--workers", "2")
UNITS = {"train_nll_mid": "nats/token", "train_nll_last": "nats/token", "valid_nll": "nats/token",
         "tgt_tokens_per_s": "tokens/s", "tgt_tokens_per_step": "tokens",
         "job_tgt_tokens_per_s": "tokens/s"}  # fmt: skip


def measure(
    work: Path,
    fairseq_python: str | None = None,
    corpora: Sequence[str] = ("corpus/debian-ende",),
    config: str = "configs/tiny.yaml",
    steps: int = 400,
    lockstep_steps: int = 20,
    init_steps: int = 150,
    controlled: bool = True,
    precision: Sequence[str] = ("fp32", "auto"),
    smoke: bool = False,
) -> list[Row]:
    """Part 1 on each of `corpora`, parts 2 and 3 on the first when `controlled`; fairseq's
    halves given `fairseq_python`; paperscale in each of `precision`."""
    if fairseq_python and not Path(fairseq_python).is_file():
        raise SystemExit(f"fairseq_python {fairseq_python}: no such file (make fairseq-venv)")
    if not fairseq_python:
        print("fairseq: no fairseq_python; only paperscale's halves run", flush=True)
    if smoke:
        steps, lockstep_steps, init_steps = 4, 3, 4
    rows: list[Row] = []
    for i, corpus in enumerate(["synthetic"] if smoke else corpora):
        name = Path(corpus).name
        here = work / f"{i}-{name}"
        if smoke:
            data = prepare_synthetic(work, 2000, ("--valid", "64", "--test", "64"), SMOKE_PREPARE)
        else:
            data = here / "data"
            cmd = [*CLI, "prepare", corpus, str(data), "--config", config, "--workers", "2"]
            run_command(cmd, here / "prepare.log")
        job, overrides = recipe.load_job(config, data, smoke)
        sides = {}
        for p in precision:
            side = "paperscale" if p == "fp32" else f"paperscale {p}"
            sides[side] = train_paperscale(
                config, overrides, here / side.replace(" ", "-"), p, steps
            )
        if fairseq_python:
            sides["fairseq"] = train_fairseq(fairseq_python, job, here, steps)
        rows += side_rows(sides, name, steps)
        if i == 0 and controlled:
            rows += lockstep_and_init(job, name, here, lockstep_steps, init_steps, fairseq_python)
    return rows


# --------------------------------------------------------------------------------------------
# 1. side by side


def figures(
    nll: dict[int, float], valid_nll: float, tokens: dict[int, float], rates: list[float],
    steps: int, job_s: float,
) -> dict[str, float]:  # fmt: skip
    """One side's figures from its log windows ({last step: nll}, {last step: target tokens per
    step}), its last validation nll, its windows' tokens/s and its seconds from launch to exit."""
    # every real target token trained on: each window's tokens per step x its steps (the first
    # window starts at step 1)
    ends = sorted(tokens)
    total = sum(tokens[e] * (e - start) for start, e in zip([0, *ends], ends, strict=False))
    return {
        "train_nll_mid": nll[steps // 2],
        "train_nll_last": nll[steps],
        "valid_nll": valid_nll,
        "tgt_tokens_per_s": statistics.median(rates),
        "tgt_tokens_per_step": total / steps,
        "job_tgt_tokens_per_s": total / job_s,
    }


def train_paperscale(
    config: str, overrides: list[str], run: Path, precision: str, steps: int
) -> dict[str, float]:
    """`paperscale train` of the preset in `precision` for `steps` steps: its figures."""
    mid = steps // 2
    over = [
        *overrides, f"train.max_steps={steps}", f"train.precision={precision}",
        f"train.eval_every={mid}", f"train.log_every={math.gcd(LOG_EVERY, mid)}",
        "train.save_every=0", "train.bleu_samples=8",
    ]  # fmt: skip
    records, seconds = train_run(config, run, over, nproc=WORLD, log=run.parent / f"{run.name}.log")
    train = {r["step"]: r for r in records if "ppl" in r}
    valid = [r["valid_ppl"] for r in records if "valid_ppl" in r and r["step"] == steps]
    nll = {s: math.log(r["ppl"]) for s, r in train.items()}
    tokens = {s: r["tgt_tokens_per_step"] for s, r in train.items()}
    rates = [r["tgt_tokens_per_s"] for r in records if "tgt_tokens_per_s" in r][2:]
    return figures(nll, math.log(valid[-1]), tokens, rates, steps, seconds)


def train_fairseq(fairseq_python: str, job: Any, work: Path, steps: int) -> dict[str, float]:
    """`fairseq-train` of the same model and recipe on the same pairs for `steps` updates: its
    figures from its json log lines (nll in bits -> nats; wps, wpb: target tokens)."""
    mid, log = steps // 2, work / "fairseq.log"
    binary = recipe.fairseq_data(fairseq_python, job, work)
    seconds = run_command(
        [
            fairseq_python, "-m", "fairseq_cli.train", str(binary),
            *recipe.fairseq_recipe(job, recipe.model_config(job)), "--update-freq",
            str(WORLD * job.train.grad_accum), "--max-update", str(steps),
            "--validate-interval-updates", str(mid), "--validate-interval", "1000000",
            "--no-save", "--save-dir", str(work / "fairseq-ckpt"), "--log-format", "json",
            "--log-interval", str(math.gcd(LOG_EVERY, mid)), "--num-workers", "1",
        ],
        log, {"OMP_NUM_THREADS": str(WORLD)},
    )  # fmt: skip
    train: dict[int, dict[str, Any]] = {}
    valid: dict[int, dict[str, Any]] = {}
    for line in log.read_text().splitlines():
        if "{" in line and "| train_inner |" in line:
            d = json.loads(line[line.index("{") :])
            train[int(d["num_updates"])] = d
        elif "{" in line and "| valid |" in line:
            d = json.loads(line[line.index("{") :])
            valid[int(d["valid_num_updates"])] = d
    ln2 = math.log(2)
    nll = {u: float(d["nll_loss"]) * ln2 for u, d in train.items()}
    tokens = {u: float(d["wpb"]) for u, d in train.items()}
    rates = [float(d["wps"]) for _, d in sorted(train.items())][1:]
    return figures(nll, float(valid[steps]["valid_nll_loss"]) * ln2, tokens, rates, steps, seconds)


def side_rows(sides: dict[str, dict[str, float]], name: str, steps: int) -> list[Row]:
    """Part 1's rows: every side's figures, then each paperscale side against fairseq."""
    rows = [
        row(key, value, UNITS[key], corpus=name, side=side,
            step=steps // 2 if key == "train_nll_mid" else steps)
        for side, figs in sides.items() for key, value in figs.items()
    ]  # fmt: skip
    fs = sides.get("fairseq")
    for side, ps in sides.items():
        if fs is None or side == "fairseq":
            continue
        ctx = {"corpus": name, "side": side}
        diff = ps["valid_nll"] - fs["valid_nll"]
        rows.append(row("valid_nll_minus_fairseq", diff, "nats/token", step=steps, **ctx))
        for key in ("tgt_tokens_per_s", "job_tgt_tokens_per_s"):  # and their _ratio rows
            rows.append(row(f"{key}_ratio", ps[key] / fs[key], "x fairseq", **ctx))
    return rows


# --------------------------------------------------------------------------------------------
# 2. lockstep and 3. initialisation


def lockstep_and_init(
    job: Any, name: str, work: Path, lockstep_steps: int, init_steps: int,
    fairseq_python: str | None,
) -> list[Row]:  # fmt: skip
    """Parts 2 and 3 on corpus `name` (prepared and binarized under `work` by part 1)."""
    accum, seed = WORLD * job.train.grad_accum, job.train.seed
    batches = recipe.dump_batches(job, max(lockstep_steps, init_steps) * accum)
    steps = [batches[i : i + accum] for i in range(0, len(batches), accum)]  # micro-batches
    cfg, exact = recipe.model_config(job), recipe.model_config(job, dropout=0.0)
    ours = recipe.initial_weights(cfg, seed)
    inits = {"paperscale": ours, "previous xavier": recipe.initial_weights(cfg, seed, True)}
    rows: list[Row] = []
    if fairseq_python:
        spec = {"bin": str(work / "fairseq-bin"), "args": recipe.fairseq_recipe(job, exact),
                "special": recipe.FAIRSEQ_SPECIAL, "seed": seed, "names": list(ours),
                "accum": accum}  # fmt: skip
        dump = work / "lockstep.pt"
        tensors = [{"src": b.src, "tgt_in": b.tgt_in, "tgt_out": b.tgt_out} for b in batches]
        torch.save({"batches": tensors[: lockstep_steps * accum], "init": ours}, dump)
        out = recipe.worker(fairseq_python, work, "lockstep", spec, str(dump), str(lockstep_steps))
        theirs = [json.loads(x) for x in out.splitlines() if x.startswith('{"step"')]
        loop = recipe.BareLoop(exact, job.optim, seed, ours, fairseq_lr=True)
        mine = [loop.step(micro) for micro in steps[:lockstep_steps]]
        worst = max(abs(a[0] / b["loss"] - 1) for a, b in zip(mine, theirs, strict=True))
        context = {"steps": lockstep_steps, "corpus": name}
        rows.append(row("lockstep_max_rel_loss_diff", worst, "relative", **context))
        # the same work in one thread each, step 1 (warm-up) left out
        timed = slice(1 if lockstep_steps > 1 else 0, None)
        fs_s, ps_s = [b["s"] for b in theirs[timed]], [a[2] for a in mine[timed]]
        rate = statistics.median(fs_s) / statistics.median(ps_s)
        rows.append(row("lockstep_speed_vs_fairseq", rate, "x fairseq", **context))
        spec = {**spec, "args": recipe.fairseq_recipe(job, cfg)}  # with dropout
        recipe.worker(fairseq_python, work, "export-init", spec, str(work / "fairseq-init.pt"))
        inits["fairseq"] = torch.load(work / "fairseq-init.pt", weights_only=True)
    last = min(10, init_steps)
    for init_name, init in inits.items():
        loop = recipe.BareLoop(cfg, job.optim, seed, init)
        nll = [loop.step(micro)[1] for micro in steps[:init_steps]]
        context = {"init": init_name, "steps": init_steps, "window": last, "corpus": name}
        rows.append(
            row("train_nll_last_steps", statistics.mean(nll[-last:]), "nats/token", **context)
        )
    return rows
