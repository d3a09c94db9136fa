"""`paperscale calibrate`: this machine's speed measured (launch/cost_model/calibrate.py) into
the file `plan --calibration` reads; with --ranks N as N local ranks of one world."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from launch.usage import UsageError


def calibration_tokens(args: argparse.Namespace) -> list[int] | None:
    """`calibrate`'s micro-batch sizes, after checking its numbers (UsageError naming one)."""
    if args.steps < 1 or args.seq_len < 1:
        raise UsageError(f"--steps and --seq-len must be >= 1, got {args.steps}, {args.seq_len}")
    if args.ranks < 1 or (args.ranks > 1 and args.device == "cuda"):
        raise UsageError(f"--ranks must be >= 1 (and 1 with --device cuda), got {args.ranks}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: torch sees no CUDA device here")
    if not args.tokens:
        return None
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        tokens = []
    if not tokens or min(tokens) < 1:
        raise UsageError(f"--tokens must be positive whole numbers (768,1536), got {args.tokens}")
    return tokens


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure this machine's step model, print it, and write the calibration file. With
    --ranks N the measurement runs as N local ranks of one world, torchrun started here."""
    import os
    import subprocess
    import sys

    from launch.config import load_config
    from launch.cost_model.calibrate import describe, measure
    from launch.local import child_env, inside_torchrun
    from trainer.run_dir import write_atomic

    tokens = calibration_tokens(args)
    load_config(args.config, args.overrides)  # a bad config is one line before any engine
    if args.ranks > 1 and not inside_torchrun():
        env = child_env(use_cuda=False)  # one thread per rank, as a CPU run's ranks
        run = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={args.ranks}", "-m", "launch.cli", *sys.argv[1:]]  # fmt: skip
        return subprocess.run(run, env=env, check=False).returncode
    main = int(os.environ.get("RANK", "0")) == 0
    cal = measure(
        args.config, args.overrides, tokens=tokens, steps=args.steps, seq_len=args.seq_len,
        device=args.device, clock=args.clock, ranks=args.ranks,
        log=(lambda line: print(line, flush=True)) if main else (lambda line: None),
    )  # fmt: skip
    if main:
        print(describe(cal))
    if args.out and main:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(args.out), json.dumps(cal, indent=1) + "\n")
        print(f"calibration      {args.out}")
    if args.ranks > 1:
        leave_together()
    return 0


def leave_together() -> None:
    """The ranks of a calibration leave at once, once rank 0 has written its file: without
    the interpreter's teardown, in which a rank whose peer has gone can abort in the process
    group's native threads (seen as `terminate called without an active exception`)."""
    import os
    import sys

    import torch.distributed as dist

    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
