"""paperscale against fairseq on the same data, model, recipe and machine, in one sitting.

    .venv/bin/python -m bench.peer_fairseq --fairseq-python .venv-fairseq/bin/python \\
        --corpus corpus/debian-ende [--corpus DIR ...] --work /tmp/bench-peer \\
        [--config configs/tiny.yaml] [--steps 400] [--lockstep-steps 20] [--init-steps 150] \\
        [--no-controlled] [--precision fp32 --precision auto] [--smoke] [--json PATH]

fairseq lives in its own venv (it pins omegaconf < 2.1 and hydra 1.0): `make fairseq-venv`
builds `.venv-fairseq` with the same torch and fairseq-fixed 0.12.3.1 from PyPI. Without
--fairseq-python only paperscale's halves run and the fairseq figures are left out (said once).

1. Side by side, per corpus: `paperscale prepare` with the preset's vocabulary; the same pairs,
   pieces and order written for fairseq-preprocess (its dictionary is our sentencepiece
   vocabulary, so the ids are ours but for the four specials); then `paperscale train` of the
   preset (2 ranks x its accumulation; fp32, and again in `auto`'s precision: bf16 where the
   CPU has it natively) and `fairseq-train` of the same model and recipe
   (one process with 2 threads, --update-freq = ranks x accumulation, the same --max-tokens),
   --steps steps each, one after the other. Figures: training nll (nats per target token, the
   log window ending there) at the middle and last step, validation nll at the last step,
   target tokens/s by each side's own meter (median of the log windows after the first) and
   over the job (every real target token trained on / seconds from launch to exit, startup,
   validation and our export included), target tokens per step, and paperscale - fairseq /
   paperscale : fairseq.
2. Lockstep: the same initial weights (ours, mapped to fairseq's names and dictionary order),
   the same micro-batches (from our loader), dropout 0 and our sinusoidal table in both, and
   fairseq's learning-rate sequence (its first update uses lr(0) = 0): paperscale's recipe as
   a bare loop (tests/integration/test_reference_recipe.py holds the trainer to it) against
   fairseq's model, criterion, Adam and inverse_sqrt (bench/fairseq_worker.py). Figure: the
   largest relative difference of the per-step losses.
3. Initialisation: the same micro-batches with dropout, from paperscale's init, fairseq's own
   (drawn by fairseq, mapped) and the per-(D, D) xavier init paperscale used before: training
   nll over the last 10 of --init-steps steps of the bare loop.

Parts 2 and 3 run on the first corpus; `--no-controlled` leaves them out (part 1 alone, ~33 min
per corpus on 2 cores). `--smoke`: a synthetic corpus, the smoke model, a few steps of each
part (seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from bench.common import CLI, Row, add_output_arguments, row, run_command, train_run, write_rows
from bench.peer_fairseq_recipe import (
    FAIRSEQ_SPECIAL,
    bare_loop,
    binarize,
    dump_batches,
    export_for_fairseq,
    fairseq_recipe,
    load_job,
    model_config,
    paperscale_init,
    previous_init,
    worker,
)
from trainer.run_dir import RunDir

WORLD = 2  # paperscale ranks; fairseq: one process with as many threads
LOG_EVERY = 20
SMOKE_VOCAB = 96
SHOWN = ("figure", "value", "unit")  # the columns; other keys are context


# --------------------------------------------------------------------------------------------
# 1. side by side


def window_total(per_step: dict[int, float]) -> float:
    """The sum over a run's steps of a per-step average logged at the end of each window
    ({last step of the window: average}; the first window starts at step 1)."""
    ends = sorted(per_step)
    return sum(per_step[e] * (e - start) for start, e in zip([0, *ends], ends, strict=False))


def paperscale_figures(run_dir: Path, mid: int, last: int, job_s: float) -> dict[str, float]:
    """Losses at `mid` and `last`; target tokens/s by our meter (median of the log windows
    after the first two) and over the whole job: every real target token trained on (the log
    windows' tokens per step x their steps) over the seconds from launch to exit."""
    records = [json.loads(x) for x in RunDir(run_dir).metrics.read_text().splitlines()]
    by_step = {r["step"]: r for r in records if "ppl" in r}
    valid = [r for r in records if "valid_ppl" in r and r["step"] == last]
    rates = [r["tgt_tokens_per_s"] for r in records if "tgt_tokens_per_s" in r][2:]
    tokens = window_total({s: r["tgt_tokens_per_step"] for s, r in by_step.items()})
    return {
        "train_nll_mid": math.log(by_step[mid]["ppl"]),
        "train_nll_last": math.log(by_step[last]["ppl"]),
        "valid_nll": math.log(valid[-1]["valid_ppl"]),
        "tgt_tokens_per_s": statistics.median(rates),
        "tgt_tokens_per_step": tokens / last,
        "job_tgt_tokens_per_s": tokens / job_s,
    }


def fairseq_figures(log: Path, mid: int, last: int, job_s: float) -> dict[str, float]:
    """From fairseq's json log lines: nll in bits -> nats; wps = target tokens/s (the median
    of its log windows after the first); wpb = target tokens per update, x the window's
    updates summed for the job's target tokens."""
    train: dict[int, dict[str, Any]] = {}
    valid: dict[int, dict[str, Any]] = {}
    for line in log.read_text().splitlines():
        if "{" not in line:
            continue
        if "| train_inner |" in line:
            d = json.loads(line[line.index("{") :])
            train[int(d["num_updates"])] = d
        elif "| valid |" in line:
            d = json.loads(line[line.index("{") :])
            valid[int(d["valid_num_updates"])] = d
    rates = [float(d["wps"]) for _, d in sorted(train.items())][1:]
    tokens = window_total({u: float(d["wpb"]) for u, d in train.items()})
    ln2 = math.log(2)
    return {
        "train_nll_mid": float(train[mid]["nll_loss"]) * ln2,
        "train_nll_last": float(train[last]["nll_loss"]) * ln2,
        "valid_nll": float(valid[last]["valid_nll_loss"]) * ln2,
        "tgt_tokens_per_s": statistics.median(rates),
        "tgt_tokens_per_step": tokens / last,
        "job_tgt_tokens_per_s": tokens / job_s,
    }


def side_by_side(args: argparse.Namespace, corpus: Path, work: Path) -> list[Row]:
    """Part 1 on one corpus: prepare it, train paperscale in every --precision and fairseq
    (with --fairseq-python) for --steps steps each; the figures of each side and the
    comparisons of paperscale's against fairseq's."""
    data = work / "data"
    vocab = ["--vocab-size", str(SMOKE_VOCAB)] if args.smoke else ["--config", args.config]
    cmd = [*CLI, "prepare", str(corpus), str(data), *vocab,
           "--workers", "2"]  # fmt: skip
    run_command(cmd, work / "prepare.log")
    job, overrides = load_job(args, data)
    steps, mid = args.steps, args.steps // 2
    log_every = math.gcd(LOG_EVERY, mid)
    sides: dict[str, dict[str, float]] = {}
    for precision in args.precision:  # fp32 first: fairseq's only precision on a CPU
        side = "paperscale" if precision == "fp32" else f"paperscale {precision}"
        sides[side] = train_paperscale(args, work / side.replace(" ", "-"), overrides,
                                       precision, log_every)  # fmt: skip
    if args.fairseq_python:
        sides["fairseq"] = train_fairseq(args, job, data, work, log_every)
    return side_rows(sides, corpus.name, mid, steps)


def train_paperscale(
    args: argparse.Namespace, ps_run: Path, overrides: list[str], precision: str, log_every: int
) -> dict[str, float]:
    """`paperscale train` of the preset in `precision` for --steps steps into a new run dir
    `ps_run`; its figures (paperscale_figures)."""
    steps, mid = args.steps, args.steps // 2
    over = [
        *overrides, f"train.max_steps={steps}", f"train.precision={precision}",
        f"train.eval_every={mid}", f"train.log_every={log_every}", "train.save_every=0",
        "train.bleu_samples=8",
    ]  # fmt: skip
    log = ps_run.parent / f"{ps_run.name}.log"
    _, ps_s = train_run(args.config, ps_run, over, nproc=WORLD, log=log)
    return paperscale_figures(ps_run, mid, steps, ps_s)


def train_fairseq(
    args: argparse.Namespace, job: Any, data: Path, work: Path, log_every: int
) -> dict[str, float]:
    """`fairseq-train` of the same model and recipe on the same pairs (exported and binarized
    under `work`) for --steps updates; its figures (fairseq_figures)."""
    steps, mid = args.steps, args.steps // 2
    text, binary = work / "fairseq-text", work / "fairseq-bin"
    export_for_fairseq(data, text, job.data.max_len)
    binarize(args.fairseq_python, text, binary, work / "fairseq-preprocess.log")
    model_cfg = model_config(job, data)
    fs_s = run_command(
        [
            args.fairseq_python, "-m", "fairseq_cli.train", str(binary),
            *fairseq_recipe(job, model_cfg), "--update-freq",
            str(WORLD * job.train.grad_accum), "--max-update", str(steps),
            "--validate-interval-updates", str(mid), "--validate-interval", "1000000",
            "--no-save", "--save-dir", str(work / "fairseq-ckpt"), "--log-format", "json",
            "--log-interval", str(log_every), "--num-workers", "1",
        ],
        work / "fairseq.log", {"OMP_NUM_THREADS": str(WORLD)},
    )  # fmt: skip
    return fairseq_figures(work / "fairseq.log", mid, steps, fs_s)


def side_rows(sides: dict[str, dict[str, float]], name: str, mid: int, steps: int) -> list[Row]:
    """The rows of part 1 on corpus `name`: every side's figures, then each paperscale side's
    validation nll and speeds against fairseq's (when fairseq ran)."""
    rows = []
    units = {"train_nll_mid": "nats/token", "train_nll_last": "nats/token",
             "valid_nll": "nats/token", "tgt_tokens_per_s": "tokens/s",
             "tgt_tokens_per_step": "tokens", "job_tgt_tokens_per_s": "tokens/s"}  # fmt: skip
    for side, figures in sides.items():
        for key, value in figures.items():
            step = mid if key == "train_nll_mid" else steps
            rows.append(row(key, value, units[key], corpus=name, side=side, step=step))
    fs = sides.get("fairseq")
    for side, ps in sides.items():
        if fs is None or side == "fairseq":
            continue
        ctx = {"corpus": name, "side": side}
        rows.append(row("valid_nll_minus_fairseq", ps["valid_nll"] - fs["valid_nll"],
                        "nats/token", step=steps, **ctx))  # fmt: skip
        rows.append(row("tgt_tokens_per_s_ratio", ps["tgt_tokens_per_s"] / fs["tgt_tokens_per_s"],
                        "x fairseq", **ctx))  # fmt: skip
        rows.append(row("job_tgt_tokens_per_s_ratio",
                        ps["job_tgt_tokens_per_s"] / fs["job_tgt_tokens_per_s"], "x fairseq",
                        **ctx))  # fmt: skip
    return rows


# --------------------------------------------------------------------------------------------
# 2. lockstep and 3. initialisation


def controlled(args: argparse.Namespace, corpus: Path, work: Path) -> list[Row]:
    """Parts 2 and 3 on the first corpus (its prepared data from part 1)."""
    data = work / "data"
    job, _ = load_job(args, data)
    accum = WORLD * job.train.grad_accum
    n = max(args.lockstep_steps, args.init_steps)
    batches = dump_batches(job, data, n * accum)
    cfg = model_config(job, data)
    exact = model_config(job, data, dropout=0.0)
    ours = paperscale_init(cfg, job.train.seed)
    rows: list[Row] = []
    spec: dict[str, Any] = {}
    if args.fairseq_python:
        text, binary = work / "fairseq-text", work / "fairseq-bin"
        if not (binary / "dict.src.txt").is_file():
            export_for_fairseq(data, text, job.data.max_len)
            binarize(args.fairseq_python, text, binary, work / "fairseq-preprocess.log")
        spec = {
            "bin": str(binary),
            "args": [*fairseq_recipe(job, cfg), "--dropout", "0.0"],
            "special": FAIRSEQ_SPECIAL,
            "seed": job.train.seed,
            "names": list(ours),
        }
        dump = work / "lockstep.pt"
        torch.save({"batches": batches[: args.lockstep_steps * accum], "init": ours}, dump)
        lines = worker(args, "lockstep", spec, str(dump), str(args.lockstep_steps))
        theirs = [json.loads(x) for x in lines.splitlines() if x.startswith("{")]
        mine = bare_loop(exact, job, ours, batches, args.lockstep_steps, accum, fairseq_lr=True)
        worst = max(abs(a[0] / b["loss"] - 1) for a, b in zip(mine, theirs, strict=True))
        context = {"steps": args.lockstep_steps, "corpus": corpus.name}
        rows.append(row("lockstep_max_rel_loss_diff", worst, "relative", **context))
        # the same work in one thread each, step 1 (warm-up) left out
        timed = slice(1 if args.lockstep_steps > 1 else 0, None)
        rate = statistics.median(b["s"] for b in theirs[timed]) / statistics.median(
            a[2] for a in mine[timed]
        )
        rows.append(row("lockstep_speed_vs_fairseq", rate, "x fairseq", **context))
    inits = {"paperscale": ours, "previous xavier": previous_init(cfg, job.train.seed)}
    if args.fairseq_python:
        out = work / "fairseq-init.pt"
        worker(args, "export-init", {**spec, "args": fairseq_recipe(job, cfg)}, str(out))
        inits["fairseq"] = torch.load(out, weights_only=True)
    last = min(10, args.init_steps)
    for name, init in inits.items():
        nll = [x[1] for x in bare_loop(cfg, job, init, batches, args.init_steps, accum, False)]
        context = {"init": name, "steps": args.init_steps, "window": last, "corpus": corpus.name}
        rows.append(
            row("train_nll_last_steps", statistics.mean(nll[-last:]), "nats/token", **context)
        )
    return rows


# --------------------------------------------------------------------------------------------


def smoke_corpus(work: Path) -> Path:
    """The synthetic corpus of --smoke under `work` (written once)."""
    corpus = work / "synthetic"
    if not (corpus / "train.en").is_file():
        cmd = [*CLI, "corpus", "synthetic", str(corpus),
               "--train", "2000", "--valid", "64", "--test", "64"]  # fmt: skip
        run_command(cmd, work / "corpus.log")
    return corpus


def print_table(rows: list[Row]) -> None:
    """Every row on one line: figure, value, unit, then its context."""
    print("\n== bench/peer_fairseq.py ==")
    for r in rows:
        context = ", ".join(f"{k}={v}" for k, v in r.items() if k not in SHOWN)
        print(f"  {r['figure']:30s} {r['value']:12.6g} {r['unit']:12s} {context}")


def main(argv: list[str] | None = None) -> int:
    """Run the parts the command line asks for on every --corpus; print and write the rows."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fairseq-python", help="python of a venv with fairseq (make fairseq-venv)")
    p.add_argument("--corpus", action="append", type=Path, help="raw corpus dir (repeatable)")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lockstep-steps", type=int, default=20)
    p.add_argument("--init-steps", type=int, default=150)
    p.add_argument("--no-controlled", action="store_true", help="side by side only (part 1)")
    p.add_argument(
        "--precision", action="append", choices=["fp32", "auto", "bf16"],
        help="paperscale's precision (repeatable; default fp32 and auto: fairseq's own and ours)",
    )  # fmt: skip
    add_output_arguments(p, "a synthetic corpus, the smoke model, a few steps of each part")
    args = p.parse_args(argv)
    args.precision = args.precision or (["fp32"] if args.smoke else ["fp32", "auto"])
    if args.fairseq_python and not Path(args.fairseq_python).is_file():
        p.error(f"--fairseq-python {args.fairseq_python}: no such file (make fairseq-venv)")
    args.work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.steps, args.lockstep_steps, args.init_steps = 4, 3, 4
        args.corpus = [smoke_corpus(args.work)]
    if not args.corpus:
        p.error("give at least one --corpus")
    if not args.fairseq_python:
        print("fairseq: no --fairseq-python; only paperscale's halves run", flush=True)
    rows: list[Row] = []
    for i, corpus in enumerate(args.corpus):
        work = args.work / f"{i}-{corpus.name}"
        rows += side_by_side(args, corpus, work)
        if i == 0 and not args.no_controlled:
            rows += controlled(args, corpus, work)
    print_table(rows)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
