"""Cost of the metrics sinks: training step time with wandb (offline) + TensorBoard + jsonl versus
jsonl alone, measured side by side in one process.

The real DeepSpeed engine (world of one, CPU or GPU) trains the tiny preset's model on random
token batches. Blocks of steps alternate between the two sink sets (ABBA order, so drift in
machine load hits both alike); every step is a log step (the worst case: the presets log every
20-100 steps) and builds the same record the trainer logs. Opening and closing the sinks is
outside the timed blocks and reported on its own. Prints the median ratio of step times. The
engine trains in the precision a training run would pick on this machine (`auto`).

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu python -m bench.sinks --repeats 4 --steps 15
    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu python -m bench.sinks --smoke --json rows.json
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import ROOT, SMOKE_MODEL, add_output_arguments, row, settle_precision, write_rows
from data_pipeline.batching import Batch
from launch.config import load_config
from model.config import BOS_ID, EOS_ID
from trainer.dist import init_distributed
from trainer.ds.engine import build_engine
from trainer.metrics import (
    MetricsLogger,
    Sink,
    memory_metrics,
)
from trainer.run_dir import RunDir
from trainer.sinks import (
    JsonlSink,
    TensorBoardSink,
    WandbSink,
)
from trainer.step import optimizer_metrics, train_step


def random_batch(vocab: int, rows: int, length: int, gen: torch.Generator) -> Batch:
    """A full (unpadded) micro-batch of random pairs: rows x length tokens on each side."""
    src = torch.randint(4, vocab, (rows, length), generator=gen)  # (B, S)
    tgt = torch.randint(4, vocab, (rows, length - 1), generator=gen)  # (B, T-1)
    bos = torch.full((rows, 1), BOS_ID)
    eos = torch.full((rows, 1), EOS_ID)
    return Batch(
        src=src,
        tgt_in=torch.cat([bos, tgt], 1),  # (B, T)
        tgt_out=torch.cat([tgt, eos], 1),  # (B, T)
        n_src_tokens=rows * length,
        n_tgt_tokens=rows * length,
    )


def open_all(run_dir: Path, run_id: str) -> list[Sink]:
    """jsonl + TensorBoard + wandb offline, as the trainer opens them."""
    return [
        JsonlSink(RunDir(run_dir).metrics),
        TensorBoardSink(RunDir(run_dir).tensorboard),
        WandbSink(run_dir, "offline", "bench", run_dir.name, run_id, {"bench": "sinks"}),
    ]


def timed_block(
    engine: Any,
    env: Any,
    batches: list[Batch],
    logger: MetricsLogger,
    first_step: int,
    precision: str,
) -> float:
    """Mean seconds per step over `batches`, logging a full record after every step."""
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        sums = train_step(engine, [batch], env, 0.1, [False]).sums
        torch.distributed.all_reduce(sums)
        loss_sum, _nll, tgt, src = sums.tolist()
        record = {
            "loss": loss_sum / tgt,
            "lr": engine.get_lr()[0],
            **optimizer_metrics(engine, precision),
            "tokens_per_s": src + tgt,
            **memory_metrics(env.device),
        }
        logger.log(first_step + i, record)
    return (time.perf_counter() - start) / len(batches)


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    """The command line, and the config overrides of the model it asks for."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=4, help="ABBA rounds (each: 2 blocks per arm)")
    p.add_argument("--steps", type=int, default=15, help="steps per timed block")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--length", type=int, default=32)
    add_output_arguments(p, "1 round of 2-step blocks, 8x16 tokens, d_model 32, vocab 64")
    args = p.parse_args()
    overrides = ["model.vocab_size=8000", "train.grad_accum=1"]
    if args.smoke:
        args.repeats, args.steps, args.rows, args.length = 1, 2, 8, 16
        overrides = [*SMOKE_MODEL, "model.vocab_size=64", "train.grad_accum=1"]
    return args, overrides


def alternate(
    args: argparse.Namespace, engine: Any, env: Any, batches: list[Batch], base: Path,
    precision: str,
) -> tuple[dict[str, list[float]], list[float]]:  # fmt: skip
    """--repeats ABBA rounds of timed blocks, each with a new run dir under `base` and its own
    sinks: jsonl alone ("off") or all of them ("on"). Seconds per step of every block by arm,
    and the seconds of opening and closing the "on" sinks, per block."""
    times: dict[str, list[float]] = {"off": [], "on": []}
    open_close: list[float] = []
    step = 1
    for r in range(args.repeats):
        for arm in ("off", "on", "on", "off") if r % 2 == 0 else ("on", "off", "off", "on"):
            run_dir = base / f"{arm}-{r}-{step}"
            run_dir.mkdir()
            t0 = time.perf_counter()
            sinks = (
                open_all(run_dir, f"bench{r}{step}")
                if arm == "on"
                else [JsonlSink(RunDir(run_dir).metrics)]
            )
            overhead = time.perf_counter() - t0
            logger = MetricsLogger(sinks)
            times[arm].append(timed_block(engine, env, batches, logger, step, precision))
            t0 = time.perf_counter()
            logger.close()
            if arm == "on":
                open_close.append(overhead + time.perf_counter() - t0)
            step += len(batches)
    return times, open_close


def report(
    args: argparse.Namespace, env: Any, precision: str, times: dict[str, list[float]],
    open_close: list[float],
) -> None:  # fmt: skip
    """Print the step times of both arms and their ratios; write the rows."""
    ratios = [on / off for on, off in zip(times["on"], times["off"], strict=True)]
    print(
        f"device {env.device}, {precision}, {args.rows}x{args.length} tokens per side, "
        "log every step"
    )
    print(f"step time, jsonl only:               median {statistics.median(times['off']):.4f} s")
    print(f"step time, jsonl + tensorboard + wandb: median {statistics.median(times['on']):.4f} s")
    print(f"ratio (sinks on / off), per block pair: {', '.join(f'{x:.3f}' for x in ratios)}")
    print(f"median ratio: {statistics.median(ratios):.3f}  (goal <= 1.05)")
    print(
        f"open + close of tensorboard + wandb per run: median {statistics.median(open_close):.2f} s"
    )
    case = {"rows": args.rows, "length": args.length, "precision": precision}
    write_rows(
        args.json,
        [
            row("step time, jsonl only", statistics.median(times["off"]), "s", **case),
            row(
                "step time, jsonl + tensorboard + wandb",
                statistics.median(times["on"]),
                "s",
                **case,
            ),
            row(
                "step time ratio, sinks on / off (median)",
                statistics.median(ratios),
                "x",
                goal="<= 1.05",
                **case,
            ),
            row("open + close of tensorboard + wandb", statistics.median(open_close), "s"),
        ],
    )


def main() -> None:
    """Time the training step with all the sinks and with jsonl alone, side by side."""
    args, overrides = parse_args()
    job = load_config(ROOT / "configs/tiny.yaml", overrides)
    env = init_distributed("auto")
    job = settle_precision(job, env, job.model)
    precision = job.train.precision
    engine = build_engine(job, job.model, env)
    gen = torch.Generator().manual_seed(0)
    vocab = int(job.model.vocab_size or 8000)
    batches = [random_batch(vocab, args.rows, args.length, gen) for _ in range(args.steps)]
    base = Path(tempfile.mkdtemp(prefix="bench-sinks-"))
    timed_block(engine, env, batches[:3], MetricsLogger([]), 0, precision)  # warm-up
    times, open_close = alternate(args, engine, env, batches, base, precision)
    shutil.rmtree(base, ignore_errors=True)
    report(args, env, precision, times, open_close)


if __name__ == "__main__":
    main()
