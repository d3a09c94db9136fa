"""Quality per step at twice the batch: the preset at B target tokens per step and at 2B (2
micro-batches, peak lr x sqrt 2: the square-root rule for Adam, Malladi et al., NeurIPS 2022),
`steps` steps each; the steps and training seconds each needs to reach B's final valid nll,
from the runs' metrics.jsonl.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from bench.common import Row, prepare_synthetic, row, train_run


def nll(record: dict) -> float:
    return math.log(record["valid_ppl"])


def to_target(records: list[dict], target: float) -> tuple[int, float] | None:
    """(step, training seconds) of the first evaluation at or below `target` nll."""
    seconds = 0.0
    for r in records:
        if "tgt_tokens_per_s" in r:  # every step is logged
            seconds += r["tgt_tokens_per_step"] / r["tgt_tokens_per_s"]
        if "valid_ppl" in r and nll(r) <= target:
            return r["step"], seconds
    return None


def measure(
    work: Path,
    config: str = "configs/demo.yaml",
    data: str = "",
    steps: int = 150,
    every: int = 20,
    lr: float = 2e-3,
    overrides: Sequence[str] = (),
) -> list[Row]:
    """B and 2B for `steps` steps, evaluated every `every`; steps and seconds to B's end nll."""
    data_dir = Path(data) if data else prepare_synthetic(work, 2000)
    base = [f"data.dir={data_dir}", "train.save_every=0", *overrides, f"train.max_steps={steps}",
            "train.log_every=1", f"train.eval_every={every}", "optim.schedule=inverse_sqrt",
            "train.budget_minutes=0"]  # fmt: skip
    runs = {}
    for name, k in (("B", 1), ("2B", 2)):
        over = [*base, f"optim.lr={lr * math.sqrt(k):.6g}", f"train.grad_accum={k}"]
        run_dir = work / f"batch-{name}"
        runs[name] = train_run(config, run_dir, over, log=run_dir.with_suffix(".log"))[0]
    target = nll([r for r in runs["B"] if "valid_ppl" in r][-1])
    case = {"target_nll": round(target, 4), "steps": steps, "lr_B": lr, "ranks": 2}
    rows = []
    for name, records in runs.items():
        hit = to_target(records, target)
        tokens = [r["tgt_tokens_per_step"] for r in records if "tgt_tokens_per_step" in r]
        rows.append(row(f"{name}: target tokens per step", sum(tokens) / len(tokens), "tokens",
                        **case))  # fmt: skip
        if hit:
            rows.append(row(f"{name}: steps to the target nll", hit[0], "steps", **case))
            rows.append(row(f"{name}: training seconds to the target nll", hit[1], "s", **case))
        else:
            rows.append(row(f"{name}: did not reach the target nll", 0.0, "steps", **case))
    return rows
