"""Measured per-rank memory of the model states under ZeRO 0-3 against `paperscale plan`.

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu .venv/bin/python -m bench.zero_memory \\
        --config configs/base.yaml [--worlds 1 2] [--bucket-elements N] [key=value ...]

For each world size one `torchrun` starts that many CPU ranks (gloo); each rank builds the real
DeepSpeed engine (trainer.ds.engine.build_engine) for stages 0, 1, 2 and 3 in turn, runs two
optimizer steps of two micro-batches on random tokens, and after every backward and every
step sums the storage bytes of the tensors that are alive and were not before the engine was
built: what the garbage collector tracks plus everything reachable from the engine's optimizer
and the module's parameters (`.grad`, ZeRO 3's `ds_tensor`), each storage counted once. The
largest of those sums is the measured resident memory of parameters, gradients, optimizer
states and DeepSpeed's persistent buffers. The prediction is launch.cost_model.plan's
`resident` bytes plus the module buffers. Transient allocations inside backward/step (the
ZeRO 1/2 reduce bucket, fp32 gradient copies) are outside both figures.

`--bucket-elements` replaces trainer.ds.config.BUCKET_ELEMENTS in the engines and the
prediction alike: at the default 5e8, ZeRO 3's resident 1 GB reduce bucket would dwarf a small
model's states.

Engines and prediction use the precision a training run would pick on this machine
(`train.precision: auto` settled as the trainer settles it). `--smoke` takes the tiny preset
at d_model 64, 2+2 layers, vocabulary 2000 and 1e5-element buckets, on 1 and 2 ranks;
`--json PATH` writes measured / predicted per world size and stage as rows (with the measured
and predicted bytes) for bench/suite.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.common import (
    CPU_ENV,
    Row,
    add_output_arguments,
    row,
    run_command,
    settle_precision,
    write_rows,
)
from launch.config import load_config
from launch.cost_model.plan import (
    Buckets,
    model_state_bytes,
    module_buffer_bytes,
    persistent_numel,
)
from model.config import ModelConfig
from model.params import count_parameters

STAGES = (0, 1, 2, 3)
TOLERANCE = 0.20
SMOKE = [
    "model.d_model=64",
    "model.n_heads=2",
    "model.d_ff=256",
    "model.encoder_layers=2",
    "model.decoder_layers=2",
    "data.vocab_size=2000",
]


def _storages_of(obj: Any, out: dict[int, int], visited: set[int], depth: int = 0) -> None:
    """Add every tensor storage reachable from `obj` (containers, DeepSpeed/torch.optim
    objects' attributes, a tensor's .grad and .ds_tensor) to `out` {data_ptr: nbytes}."""
    if id(obj) in visited or depth > 6:
        return
    visited.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.device.type != "meta":
            storage = obj.untyped_storage()
            out[storage.data_ptr()] = storage.nbytes()
        for attr in ("grad", "ds_tensor"):
            inner = getattr(obj, attr, None)
            if inner is not None:
                _storages_of(inner, out, visited, depth + 1)
        return
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(("deepspeed", "torch.optim")):
        items = list(vars(obj).values())
    else:
        return
    for item in items:
        _storages_of(item, out, visited, depth + 1)


def live_storages(*roots: Any) -> dict[int, int]:
    """{data_ptr: nbytes} of the tensors the garbage collector tracks and those under roots.

    Objects frozen by gc.freeze() are neither collected nor listed: measure_stage freezes what
    existed before the engine (its storages are excluded anyway), so that each of its scans
    walks the objects made since instead of everything torch and DeepSpeed hold."""
    gc.collect()
    out: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type != "meta":
            try:
                storage = obj.untyped_storage()
            except RuntimeError:
                continue
            out[storage.data_ptr()] = storage.nbytes()
    visited: set[int] = set()
    for root in roots:
        _storages_of(root, out, visited)
    return out


def measure_stage(job: Any, model_cfg: ModelConfig, env: Any, stage: int) -> dict[str, float]:
    """Build the engine for `stage`, train two steps, return the largest new resident bytes."""
    from model.loss import label_smoothed_loss
    from trainer.ds.engine import build_engine

    job.train.zero_stage = stage
    torch.manual_seed(1)
    vocab = model_cfg.vocab_size or 8
    src = torch.randint(4, vocab, (4, 16))  # (B, S)
    tgt = torch.randint(4, vocab, (4, 17))  # (B, T + 1)
    before = set(live_storages())
    gc.freeze()  # everything alive now is in `before`: the scans below skip it
    engine = build_engine(job, model_cfg, env)
    exclude = before | {t.untyped_storage().data_ptr() for t in (src, tgt)}
    peak = 0
    for _ in range(2 * job.train.grad_accum):
        loss, _, n = label_smoothed_loss(engine(src, tgt[:, :-1]), tgt[:, 1:], 0.1)
        engine.backward(loss / n)
        del loss, n
        for _point in ("after backward", "after step"):
            live = live_storages(engine.optimizer, list(engine.module.parameters()))
            peak = max(peak, sum(b for p, b in live.items() if p not in exclude and p != 0))
            if _point == "after backward":
                engine.step()
    optimizer = type(engine.optimizer).__name__
    engine.destroy()
    del engine
    gc.unfreeze()
    gc.collect()
    return {"stage": stage, "measured": float(peak), "optimizer": optimizer}


def predicted_bytes(model_cfg: ModelConfig, stage: int, world: int, precision: str) -> float:
    """launch.cost_model.plan's resident model states plus module buffers for this rank."""
    from trainer.ds import config as ds_config

    elems = ds_config.BUCKET_ELEMENTS
    buckets = Buckets(elems, elems, elems, 100_000)
    persistent = persistent_numel(model_cfg, buckets.persistence_threshold) if stage == 3 else 0
    n_params = count_parameters(model_cfg)["total"]
    states = model_state_bytes(n_params, stage, world, precision, buckets, persistent)
    return states["resident"] + module_buffer_bytes(model_cfg)


def worker(args: argparse.Namespace) -> None:
    """One rank: every stage in turn; rank 0 appends its rows to --out."""
    from trainer.dist import init_distributed
    from trainer.ds import config as ds_config

    if args.bucket_elements:
        ds_config.BUCKET_ELEMENTS = args.bucket_elements
    job = load_config(args.config, args.overrides)
    job.logging.wandb = "disabled"
    env = init_distributed("cpu")
    vocab = job.model.vocab_size or job.data.vocab_size
    model_cfg = ModelConfig(**{**job.model.__dict__, "vocab_size": vocab})
    job = settle_precision(job, env, model_cfg)
    rows = []
    for stage in STAGES:
        result = measure_stage(job, model_cfg, env, stage)
        result["world"] = env.world_size
        result["precision"] = job.train.precision
        result["predicted"] = predicted_bytes(model_cfg, stage, env.world_size, job.train.precision)
        result["ratio"] = result["measured"] / result["predicted"]
        rows.append(result)
    if env.is_main:
        with open(args.out, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")


def run_world(args: argparse.Namespace, world: int, out: Path) -> None:
    """One torchrun of `world` ranks over every stage."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={world}", str(Path(__file__).resolve()), "--worker",
        "--out", str(out), "--config", args.config,
        "--bucket-elements", str(args.bucket_elements), *args.overrides,
    ]  # fmt: skip
    run_command(cmd, out.with_name(f"world{world}.log"), CPU_ENV, args.timeout)


def format_table(rows: list[dict]) -> str:
    precision = rows[0]["precision"] if rows else "?"
    lines = [
        f"precision {precision}",
        "ranks  stage  optimizer                        measured MiB  predicted MiB  ratio",
    ]
    for r in rows:
        lines.append(
            f"{r['world']:>5}  {r['stage']:>5}  {r['optimizer']:<31}  "
            f"{r['measured'] / 2**20:>12.2f}  {r['predicted'] / 2**20:>13.2f}  {r['ratio']:5.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/base.yaml")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--bucket-elements", type=int, default=0, help="0 = ds_config's")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per torchrun")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    add_output_arguments(parser, "configs/tiny.yaml at d_model 64, vocabulary 2000, 1e5 buckets")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.smoke:
        args.config, args.bucket_elements = "configs/tiny.yaml", 100_000
        args.overrides = [*SMOKE, *args.overrides]
    with tempfile.TemporaryDirectory(prefix="zero-memory-") as tmp:
        out = Path(tmp) / "rows.jsonl"
        for world in args.worlds:
            run_world(args, world, out)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    print(f"config {args.config} {' '.join(args.overrides)}".rstrip())
    print(format_table(rows))
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"worst |measured/predicted - 1| = {worst:.3f} (tolerance {TOLERANCE})")
    write_rows(args.json, result_rows(rows, args))


def result_rows(rows: list[dict], args: argparse.Namespace) -> list[Row]:
    """The suite's rows: measured / predicted per world size and stage (with both byte counts
    and the fields of the table as context), then the worst deviation."""
    out = [
        row(
            f"measured / predicted, {r['world']} rank(s), ZeRO {r['stage']}",
            r["ratio"],
            "x",
            world=r["world"],
            stage=r["stage"],
            measured=r["measured"],
            predicted=r["predicted"],
            optimizer=r["optimizer"],
            precision=r["precision"],
            config=args.config,
        )
        for r in rows
    ]
    worst = max(abs(r["ratio"] - 1) for r in rows)
    out.append(row("worst |measured / predicted - 1|", worst, "x", tolerance=TOLERANCE))
    return out


if __name__ == "__main__":
    main()
