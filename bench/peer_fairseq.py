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
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentencepiece
import torch

from bench.common import SMOKE_MODEL, Row, add_output_arguments, row, write_rows
from data_pipeline.manifest import read_manifest, tokenizer_path
from data_pipeline.shards import decode_sample, iter_shard
from data_pipeline.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from launch.config import load_config
from model.config import ModelConfig
from model.transformer import Transformer
from trainer.ds.engine import resolve_model_config, seed_everything
from trainer.schedule import build_scheduler, inverse_sqrt_lr

ROOT = Path(__file__).resolve().parents[1]

WORLD = 2  # paperscale ranks; fairseq: one process with as many threads
LOG_EVERY = 20
# fairseq's dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3, then our pieces in our order
FAIRSEQ_SPECIAL = {PAD_ID: 1, UNK_ID: 3, BOS_ID: 0, EOS_ID: 2}
SMOKE_VOCAB = 96
SHOWN = ("figure", "value", "unit")  # the columns; other keys are context


def run(cmd: Sequence[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Run `cmd`, its output to `log`; the seconds it took from start to exit. A failure
    raises with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(
            list(cmd), stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            cwd=ROOT,
        )  # fmt: skip
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}:\n{tail}")
    return time.perf_counter() - started


# --------------------------------------------------------------------------------------------
# data for both


def export_for_fairseq(data: Path, out: Path, max_len: int) -> None:
    """train/valid as sentencepiece pieces, exactly the pairs and order our loader reads
    (training pairs longer than `max_len` skipped as it skips them), and dict.txt."""
    out.mkdir(parents=True, exist_ok=True)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_path(data)))
    m = read_manifest(data)
    vocab = sp.get_piece_size()
    with open(out / "dict.txt", "w") as f:
        f.writelines(f"{sp.id_to_piece(i)} {vocab - i}\n" for i in range(4, vocab))
    for split in ("train", "valid"):
        with open(out / f"{split}.src", "w") as fs, open(out / f"{split}.tgt", "w") as ft:
            for shard in m["splits"][split]["shards"]:
                for raw in iter_shard(data / shard["name"]):
                    src, tgt = decode_sample(raw, m["dtype"], vocab)
                    if split == "train" and max(len(src), len(tgt) + 1) > max_len:
                        continue
                    fs.write(" ".join(sp.id_to_piece(int(i)) for i in src[:-1]) + "\n")
                    ft.write(" ".join(sp.id_to_piece(int(i)) for i in tgt) + "\n")


def fairseq_recipe(job: Any, model_cfg: ModelConfig) -> list[str]:
    """fairseq-train arguments of the preset's model and recipe (fp32, no clipping unless set)."""
    m, o = model_cfg, job.optim
    peak = o.lr if o.lr is not None else m.d_model**-0.5 * o.warmup_steps**-0.5
    return [
        "--cpu", "--task", "translation", "-s", "src", "-t", "tgt",
        "--arch", "transformer", "--share-all-embeddings",
        "--encoder-layers", str(m.encoder_layers), "--decoder-layers", str(m.decoder_layers),
        "--encoder-embed-dim", str(m.d_model), "--decoder-embed-dim", str(m.d_model),
        "--encoder-ffn-embed-dim", str(m.d_ff), "--decoder-ffn-embed-dim", str(m.d_ff),
        "--encoder-attention-heads", str(m.n_heads), "--decoder-attention-heads", str(m.n_heads),
        "--dropout", str(m.dropout), "--attention-dropout", str(m.attention_dropout),
        "--activation-dropout", str(m.activation_dropout),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(m.label_smoothing),
        "--optimizer", "adam", "--adam-betas", f"({o.beta1},{o.beta2})", "--adam-eps", str(o.eps),
        "--weight-decay", str(o.weight_decay), "--clip-norm", str(o.clip_grad),
        "--lr", str(peak), "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(o.warmup_steps), "--warmup-init-lr", str(o.warmup_init_lr),
        "--max-tokens", str(job.data.max_tokens), "--seed", str(job.train.seed),
    ]  # fmt: skip


def binarize(fsq_python: str, text: Path, out: Path, log: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)  # fairseq-preprocess refuses an existing dictionary
    run(
        [
            fsq_python, "-m", "fairseq_cli.preprocess", "--source-lang", "src",
            "--target-lang", "tgt", "--trainpref", str(text / "train"),
            "--validpref", str(text / "valid"), "--srcdict", str(text / "dict.txt"),
            "--joined-dictionary", "--destdir", str(out), "--workers", "2",
        ],
        log,
    )  # fmt: skip


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
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
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
    name = corpus.name
    data = work / "data"
    vocab = ["--vocab-size", str(SMOKE_VOCAB)] if args.smoke else ["--config", args.config]
    run([sys.executable, "-m", "launch.cli", "prepare", str(corpus), str(data), *vocab,
         "--workers", "2"], work / "prepare.log")  # fmt: skip
    job, overrides = load_job(args, data)
    steps, mid = args.steps, args.steps // 2
    log_every = math.gcd(LOG_EVERY, mid)
    sides: dict[str, dict[str, float]] = {}
    for precision in args.precision:  # fp32 first: fairseq's only precision on a CPU
        side = "paperscale" if precision == "fp32" else f"paperscale {precision}"
        ps_run = work / side.replace(" ", "-")
        shutil.rmtree(ps_run, ignore_errors=True)  # a new run, not a resumed one
        ps_s = run(
            [
                sys.executable, "-m", "launch.cli", "train", "--config", args.config, "--nproc",
                str(WORLD), "--run-dir", str(ps_run), *overrides, f"train.max_steps={steps}",
                f"train.precision={precision}", f"train.eval_every={mid}",
                f"train.log_every={log_every}", "train.save_every=0", "train.bleu_samples=8",
                "logging.wandb=disabled", "logging.tensorboard=false",
            ],
            work / f"{ps_run.name}.log", {"OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"},
        )  # fmt: skip
        sides[side] = paperscale_figures(ps_run, mid, steps, ps_s)
    if args.fairseq_python:
        text, binary = work / "fairseq-text", work / "fairseq-bin"
        export_for_fairseq(data, text, job.data.max_len)
        binarize(args.fairseq_python, text, binary, work / "fairseq-preprocess.log")
        model_cfg = model_config(job, data)
        fs_s = run(
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
        sides["fairseq"] = fairseq_figures(work / "fairseq.log", mid, steps, fs_s)
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


def load_job(args: argparse.Namespace, data: Path) -> tuple[Any, list[str]]:
    overrides = [f"data.dir={data}", *(SMOKE_MODEL if args.smoke else [])]
    return load_config(ROOT / args.config, overrides), overrides


def model_config(job: Any, data: Path, **changes: Any) -> ModelConfig:
    cfg = resolve_model_config(job.model, Tokenizer(tokenizer_path(data)))
    return ModelConfig(**{**cfg.__dict__, **changes})


def dump_batches(job: Any, data: Path, micro: int) -> list[dict[str, torch.Tensor]]:
    """The first `micro` micro-batches of a one-rank stream with the preset's data settings."""
    from data_pipeline.loader import TokenBatchStream

    cfg = job.data.__class__(**{**job.data.__dict__, "num_workers": 0})
    stream = TokenBatchStream(data, "train", cfg)
    it = iter(stream)
    out = []
    for _ in range(micro):
        b = next(it)
        out.append({"src": b.src, "tgt_in": b.tgt_in, "tgt_out": b.tgt_out})
    stream.close()
    return out


def paperscale_init(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    seed_everything(seed)
    return Transformer(cfg).state_dict()


def previous_init(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Xavier-uniform on every (out, in) projection, zero biases: paperscale's init until the
    fairseq comparison found Q/K/V sqrt(2) and the second feed-forward layer 2.2x too large."""
    seed_everything(seed)
    model = Transformer(cfg)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.xavier_uniform_(module.weight)
            torch.nn.init.zeros_(module.bias)
    return model.state_dict()


def bare_loop(
    cfg: ModelConfig, job: Any, init: dict[str, torch.Tensor],
    batches: list[dict[str, torch.Tensor]], steps: int, accum: int, fairseq_lr: bool,
) -> list[tuple[float, float, float]]:  # fmt: skip
    """paperscale's recipe without the trainer: (loss, nll, seconds) per step, per target
    token."""
    torch.manual_seed(job.train.seed)  # the dropout stream, the same for every initial state
    model = Transformer(cfg)
    model.load_state_dict(init)
    model.train()
    o = job.optim
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(o.beta1, o.beta2), eps=o.eps)
    if fairseq_lr:  # update k uses lr(k - 1); lr(0) = warmup_init_lr
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt,
            lambda k: o.warmup_init_lr if k == 0 else inverse_sqrt_lr(
                k, d_model=cfg.d_model, warmup_steps=o.warmup_steps, lr=o.lr,
                warmup_init_lr=o.warmup_init_lr,
            ),
        )  # fmt: skip
    else:
        sched = build_scheduler(
            opt, d_model=cfg.d_model, warmup_steps=o.warmup_steps, lr=o.lr,
            warmup_init_lr=o.warmup_init_lr,
        )  # fmt: skip
    out = []
    for step in range(steps):
        started = time.perf_counter()
        micro = batches[accum * step : accum * (step + 1)]
        tokens = sum(int(b["tgt_out"].ne(PAD_ID).sum()) for b in micro)
        loss_sum = nll_sum = 0.0
        for b in micro:
            loss, nll, _ = model(b["src"], b["tgt_in"], b["tgt_out"], cfg.label_smoothing)
            (loss / tokens).backward()
            loss_sum, nll_sum = loss_sum + float(loss.detach()), nll_sum + float(nll)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        out.append((loss_sum / tokens, nll_sum / tokens, time.perf_counter() - started))
    return out


def worker(args: argparse.Namespace, command: str, spec: dict[str, Any], *rest: str) -> str:
    spec_path = Path(args.work) / "fairseq-spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [args.fairseq_python, str(ROOT / "bench" / "fairseq_worker.py"), command,
           str(spec_path), *rest]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ,
                          "OMP_NUM_THREADS": "1"})  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"fairseq_worker {command} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


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
    corpus = work / "synthetic"
    if not (corpus / "train.en").is_file():
        run([sys.executable, "-m", "launch.cli", "corpus", "synthetic", str(corpus), "--train",
             "2000", "--valid", "64", "--test", "64"], work / "corpus.log")  # fmt: skip
    return corpus


def print_table(rows: list[Row]) -> None:
    print("\n== bench/peer_fairseq.py ==")
    for r in rows:
        context = ", ".join(
            f"{k}={v}" for k, v in r.items() if k not in ("figure", "value", "unit")
        )
        print(f"  {r['figure']:30s} {r['value']:12.6g} {r['unit']:12s} {context}")


def main(argv: list[str] | None = None) -> int:
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
