"""torchrun's agent with the ranks forked from it, for CPU runs.

A rank started as a new interpreter imports torch, DeepSpeed and the trainer before its first
step: ~3.5 s of CPU each on a 2-core AMD EPYC, beside the ~2.6 s torchrun's own agent spends
importing torch. Here the agent imports them once (`preload`), then runs torchrun itself
(`torch.distributed.run`, its rendezvous, restarts and signal handling unchanged) with
`--run-path launch/rank.py --start-method=fork`: each rank is a fork of the agent that runs
`paperscale train` at once (bench `startup`, docs/architecture.md).

Only where no CUDA device is used: CUDA cannot be used in a process forked from one that
initialised it, and a GPU node's ranks start as new interpreters (`torch.distributed.run`, as
before). PAPERSCALE_RANK_START=exec starts CPU ranks that way too.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from pathlib import Path

RANK_START_ENV = "PAPERSCALE_RANK_START"
STARTS = {"fork": "forked from a preloaded agent", "exec": "each a new interpreter"}
RANK_SCRIPT = Path(__file__).resolve().with_name("rank.py")


def rank_start(use_cuda: bool, environ: dict[str, str] | None = None) -> str:
    """How ranks start: "fork" (from this agent) or "exec" (new interpreters); exec with CUDA,
    else PAPERSCALE_RANK_START (auto: fork). An unknown value is a ConfigError naming it."""
    value = (os.environ if environ is None else environ).get(RANK_START_ENV, "auto")
    if value not in ("auto", "fork", "exec"):
        from launch.config import ConfigError

        raise ConfigError(RANK_START_ENV, f"{value!r}: must be auto, fork or exec")
    if use_cuda:
        return "exec"
    return "exec" if value == "exec" else "fork"


def torchrun_program(start: str, python: str = sys.executable) -> list[str]:
    """`python` running torchrun's agent: this module for forked ranks, else torchrun's."""
    return [python, "-m", "launch.agent" if start == "fork" else "torch.distributed.run"]


def rank_command(start: str) -> list[str]:
    """torchrun's arguments naming what each rank runs (`paperscale train`'s arguments follow)."""
    if start == "fork":
        return ["--run-path", "--start-method=fork", str(RANK_SCRIPT)]
    return ["-m", "launch.cli"]


def preload() -> None:
    """What a rank of a CPU run imports before its first step, and DeepSpeed's CPU ops, probed
    (a C compile for each op's compatibility) and loaded once: a forked rank finds them loaded.
    Nothing here touches a device or starts a thread beyond the one idle native thread that
    `import torch` itself starts (measured: 2 tasks after `import torch`, 2 after this), so a
    rank forked afterwards starts as clean as an exec'd one."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import deepspeed.runtime.engine  # noqa: F401

    import launch.cmd_train  # noqa: F401
    import trainer.loop
    import trainer.validation  # noqa: F401
    from trainer.ds.ops import build_ops, op_locks, wait_for_build_locks

    wait_for_build_locks(op_locks(), lambda line: print(f"paperscale: {line}", file=sys.stderr))
    build_ops()  # an op it cannot load, each rank tries again as before


# exit handlers the agent registered after `preload` (torchrun's): not a rank's to run
AGENT_EXIT_HANDLERS: list[Callable[..., object]] = []


def record_agent_exit_handlers() -> None:
    register = atexit.register

    def recording(func: Callable[..., object], *args: object, **kwargs: object) -> object:
        AGENT_EXIT_HANDLERS.append(func)
        return register(func, *args, **kwargs)

    atexit.register = recording  # type: ignore[assignment]


def main() -> None:
    preload()
    record_agent_exit_handlers()
    from torch.distributed.run import main as torchrun

    torchrun()


if __name__ == "__main__":
    main()
