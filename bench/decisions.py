"""How steady `train.precision: auto` is on a CPU: the bf16/fp32 matmul ratio its measurement
reads at the suite's, a near-tie's, the demo's and the tiny preset's shapes, idle and beside four
busy processes, and how many answers repeated resolutions give, measured afresh each time and
through the machine cache as a run resolves it.

The measurement path runs as on a CPU with native bf16 instructions (the flags are claimed, so
that it runs on any CPU); on one without them, bf16 is emulated and its ratios are large.
`this machine` rows resolve with the machine's own flags through a fresh cache.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.common import Row, busy_processes, row
from trainer.machine_cache import MachineCache
from trainer.precision import (
    BF16_MIN_SPEEDUP,
    cached_bf16_slowdown,
    cpu_bf16_verdict,
    measure_bf16_slowdown,
)

SHAPES = {"suite": (32, 64), "near-tie": (64, 256), "demo": (128, 512), "tiny": (256, 1024)}
NATIVE = {"avx512_bf16": True}


def answer(d_model: int, d_ff: int, caps: dict[str, bool] | None, cache: MachineCache) -> str:
    verdict = cpu_bf16_verdict(
        d_model, d_ff, {}, caps, probe=lambda d, f: cached_bf16_slowdown(d, f, cache)
    )
    return "bf16" if verdict.use_bf16 else "fp32"


def one_shape(
    name: str, d_model: int, d_ff: int, load: str, probes: int, resolutions: int
) -> list[Row]:
    """The rows of one shape under one load."""
    ratios = [measure_bf16_slowdown(d_model, d_ff) for _ in range(probes)]
    fresh = {"bf16" if r * BF16_MIN_SPEEDUP <= 1.0 else "fp32" for r in ratios}
    answers: dict[str, set[str]] = {}
    for flags, caps in (("native flags", NATIVE), ("this machine", None)):
        with tempfile.TemporaryDirectory() as tmp:
            cache = MachineCache(Path(tmp))
            answers[flags] = {answer(d_model, d_ff, caps, cache) for _ in range(resolutions)}
    case = {"shape": name, "d_model": d_model, "d_ff": d_ff, "load": load}
    label = f"{name} (d_model {d_model}, d_ff {d_ff}), {load}"
    return [
        row(f"{label}: bf16/fp32 ratio, lowest of {probes}", min(ratios), "x", **case),
        row(f"{label}: bf16/fp32 ratio, highest of {probes}", max(ratios), "x", **case),
        row(f"{label}: answers of {probes} fresh measurements", len(fresh), "answers", **case),
        row(
            f"{label}: answers of {resolutions} cached resolutions, native flags "
            f"({'/'.join(sorted(answers['native flags']))})",
            len(answers["native flags"]),
            "answers",
            goal="<= 1",
            **case,
        ),
        row(
            f"{label}: answers of {resolutions} cached resolutions, this machine "
            f"({'/'.join(sorted(answers['this machine']))})",
            len(answers["this machine"]),
            "answers",
            goal="<= 1",
            **case,
        ),
    ]


def measure(
    shapes: tuple[str, ...] = tuple(SHAPES), probes: int = 5, resolutions: int = 20
) -> list[Row]:
    """Each shape idle, then beside four busy processes."""
    rows: list[Row] = []
    for load in ("idle", "4 busy processes"):
        for name in shapes:
            d_model, d_ff = SHAPES[name]
            if load == "idle":
                rows += one_shape(name, d_model, d_ff, load, probes, resolutions)
                continue
            with busy_processes(4):
                rows += one_shape(name, d_model, d_ff, load, probes, resolutions)
    return rows
