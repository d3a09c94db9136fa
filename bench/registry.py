"""The bench registry: every bench declared once (name, what it measures, its program, the
arguments of its full and smoke sizes, its environment, timeouts and what its full size needs).
`python -m bench.suite --list` prints it; bench/runner.py runs one entry."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from bench.common import SMOKE_MODEL

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
FULL_WORK = Path(tempfile.gettempdir()) / "paperscale-bench"
TORCHRUN = ("{python}", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
CPU_RANKS = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
# what writes each input a full-size bench may need
MADE_BY = {
    "corpus/": "`make bench` fetches it",
    "data/debian-ende": "`make demo` prepares it",
    "runs/demo": "`make demo` trains and writes it",
    ".venv-fairseq": "`make fairseq-venv` installs fairseq beside torch",
}


def _always() -> str | None:
    return None


def _needs_cuda() -> str | None:
    """Why the GPU bench cannot run at full size here, or None."""
    import torch

    if torch.cuda.is_available():
        return None
    return "no CUDA device (torch.cuda.is_available() is False); `--smoke` runs its CPU path"


def needs_paths(*paths: str) -> Callable[[], str | None]:
    """A `needs` that asks for every path (relative to the repository) to exist."""

    def needs() -> str | None:
        for path in paths:
            if not (ROOT / path).exists():
                made_by = next((m for p, m in MADE_BY.items() if path.startswith(p)), "")
                return f"{path} is missing ({made_by})"
        return None

    return needs


DEBIAN_CORPUS = needs_paths("corpus/debian-ende/train.en")
DEMO_DATA = needs_paths("data/debian-ende/manifest.json")
DEMO_RUN = needs_paths("runs/demo/model/model.json", "data/debian-ende/manifest.json")
FAIRSEQ = needs_paths(
    ".venv-fairseq/bin/python",
    "corpus/debian-ende/train.en",
    "corpus/debian-ende-by-source/train.en",
)


@dataclasses.dataclass(frozen=True)
class Bench:
    """One registered bench, declared once: what it measures, how, and its two sizes.

    Most benches are a function `measure` ("module:function" in bench/) that returns rows, run
    as `python -m bench NAME` (under torchrun on `ranks` CPU ranks when more than one) with the
    keyword arguments `full` or `smoke`. A bench with a program of its own (bench/gpu.sh) gives
    `run` instead, and gets `--smoke` and `--json {json}`. In a command `{python}` is this
    interpreter, `{json}` the rows file the suite reads, `{work}` a scratch directory of this
    bench's own. `env` is set for the run (and shown with the command). `needs` says why the
    full run cannot happen on this machine (None: it can); a smoke run is always possible.
    """

    name: str
    about: str
    measure: str = ""
    full: Mapping[str, Any] = dataclasses.field(default_factory=dict, kw_only=True)
    smoke: Mapping[str, Any] = dataclasses.field(default_factory=dict, kw_only=True)
    run: tuple[str, ...] = dataclasses.field(default=(), kw_only=True)
    ranks: int = dataclasses.field(default=1, kw_only=True)
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: ONE_THREAD, kw_only=True)
    timeout_s: float = dataclasses.field(default=1800, kw_only=True)
    smoke_timeout_s: float = dataclasses.field(default=300, kw_only=True)
    needs: Callable[[], str | None] = dataclasses.field(default=_always, kw_only=True)

    def command(self, smoke: bool) -> tuple[str, ...]:
        size = ("--smoke",) if smoke else ()
        if self.run:
            return (*self.run, *size, "--json", "{json}")
        launcher = (
            (*TORCHRUN[:-1], f"--nproc_per_node={self.ranks}") if self.ranks > 1 else ("{python}",)
        )
        return (*launcher, "-m", "bench", self.name, *size, "--work", "{work}", "--json", "{json}")


STUDIES = ROOT / "configs" / "bench"


def _studies() -> tuple[Bench, ...]:
    """One bench per study in configs/bench/ (bench/study.py runs it)."""
    from omegaconf import OmegaConf

    out = []
    for path in sorted(STUDIES.glob("*.yaml")):
        study = OmegaConf.load(path)
        runs = len(study.arms) * study.get("rounds", 1)
        where = {"path": str(path.relative_to(ROOT))}
        out.append(
            Bench(
                path.stem,
                " ".join(str(study.about).split()),
                "study:run_study",
                full=where,
                smoke={**where, "smoke": True},
                env=CPU_RANKS,
                timeout_s=float(study.get("timeout", 1800)) * runs,
                smoke_timeout_s=420,
                needs=needs_paths(study.needs) if "needs" in study else _always,
            )
        )
    return tuple(out)


def _checkpoint(name: str, what: str, preset: str, **kw: Any) -> Bench:
    """bench/checkpoint.py on a preset, on 2 CPU ranks under torchrun."""
    small = [*SMOKE_MODEL, "data.vocab_size=64", *kw.pop("smoke_overrides", [])]
    smoke = {"config": "configs/tiny.yaml", "overrides": small, "rounds": 1}
    return Bench(
        name,
        f"Checkpoint size and save / load seconds of {what} on 2 CPU ranks, against "
        "`paperscale plan`'s estimate.",
        "checkpoint:measure",
        full={"config": f"configs/{preset}.yaml"},
        smoke=smoke,
        ranks=2,
        env=CPU_RANKS,
        **kw,
    )


def _peer(name: str, about: str, **kw: Any) -> Bench:
    """bench/peer_fairseq.py against fairseq's venv on the Debian corpus."""
    corpora = kw.pop("corpora", ["corpus/debian-ende"])
    full = {"fairseq_python": ".venv-fairseq/bin/python", "corpora": corpora, **kw.pop("full", {})}
    return Bench(
        name,
        about,
        "peer_fairseq:measure",
        full=full,
        smoke={"smoke": True, **kw.pop("smoke", {})},
        env=CPU_RANKS,
        smoke_timeout_s=420,
        needs=FAIRSEQ,
        **kw,
    )


REGISTRY: tuple[Bench, ...] = (
    Bench(
        "decode",
        "Decoding sentences/s of greedy and beam 4 search, with and without the key/value cache.",
        "decode:cache",
        smoke={"smoke": True, "batch": 4, "src_len": 12, "tgt_len": 12, "repeats": 1},
        smoke_timeout_s=120,
    ),
    Bench(
        "decode_mixed",
        "Decoding sentences/s (cache on) of a batch of varied source lengths, each sentence "
        "ending at its own maximum length.",
        "decode:mixed",
        smoke={"smoke": True, "batch": 32, "max_src": 12, "repeats": 1},
        smoke_timeout_s=120,
    ),
    Bench(
        "engines",
        "Serving engines on the demo model: sentences/s, test BLEU and outputs equal to ours, "
        "for paperscale, Transformers and CTranslate2 (fp32, int8), beam 4.",
        "decode:engines",
        full={"model": "runs/demo", "data": "data/debian-ende"},
        smoke={"smoke": True, "repeats": 1},
        timeout_s=3600,
        needs=DEMO_RUN,
    ),
    Bench(
        "data",
        "Data pipeline: shard bytes per sample, loader tokens/s, padding at a 4,096-token "
        "budget, prepare pairs/s and peak memory.",
        "data:measure",
        full={"corpus": "corpus/debian-ende"},
        smoke={"smoke": True},
        timeout_s=3600,
        needs=DEBIAN_CORPUS,
    ),
    _checkpoint("checkpoint", "the base model", "base"),
    _checkpoint(
        "checkpoint_tiny",
        "the demo preset, and the background save's stall,",
        "tiny",
        timeout_s=900,
    ),
    Bench(
        "plan_calibration",
        "`paperscale plan`'s step model on this machine: one CPU rank's effective GFLOP/s and "
        "overheads per step and per micro-batch (tiny preset), and the model's error at the "
        "preset's own batch.",
        "plan_calibration:measure",
        smoke={"smoke": True},
        timeout_s=900,
        smoke_timeout_s=120,
    ),
    Bench(
        "batch_scaling",
        "Steps and training seconds to the same valid nll at B and 2B target tokens per step "
        "(peak lr x sqrt 2), demo preset's model on 2 CPU ranks.",
        "batch_scaling:measure",
        full={"data": "data/debian-ende"},
        smoke={
            "steps": 12,
            "every": 4,
            "overrides": [
                *SMOKE_MODEL,
                "train.bleu_samples=8",
                "train.budget_calibration_steps=5",
                "optim.warmup_steps=5",
            ],
        },
        env=CPU_RANKS,
        timeout_s=3600,
        smoke_timeout_s=400,
        needs=DEMO_DATA,
    ),
    _checkpoint("checkpoint_big", "the big model", "big", smoke_overrides=["train.zero_stage=1"]),
    Bench(
        "loss_memory",
        "Peak memory of the output projection and loss, forward and backward, at the base "
        "preset: logits materialised against the chunked loss.",
        "loss_memory:measure",
        smoke={"d_model": 32, "vocab": 8000},
        timeout_s=900,
    ),
    Bench(
        "preemption",
        "Seconds from SIGTERM to every process of a 2-rank run to its checkpoint and exit 75, "
        "tiny and base presets.",
        "preemption:measure",
        smoke={"smoke": True},
        env=CPU_RANKS,
        needs=DEMO_DATA,
    ),
    Bench(
        "zero_memory",
        "Measured per-rank memory of the model states under ZeRO 0-3 on 1 and 2 ranks against "
        "`paperscale plan`.",
        "zero_memory:measure",
        smoke={"smoke": True, "timeout": 300},
        env=CPU_RANKS,
        timeout_s=3600,
        smoke_timeout_s=420,
    ),
    Bench(
        "train_overhead",
        "Tokens/s of the paperscale training step against a bare PyTorch loop, same batches and"
        " precision.",
        "train_overhead:measure",
        smoke={
            "pairs": 2000,
            "windows": 1,
            "steps": 2,
            "warmup": 1,
            "overrides": [*SMOKE_MODEL, "train.log_every=1"],
        },
        env=CPU_RANKS,
        timeout_s=3600,
    ),
    _peer(
        "peer_fairseq",
        "paperscale against fairseq on the demo recipe, same data, model and machine: training "
        "and validation nll, target tokens/s (shuffled and source-ordered input); the same "
        "weights and batches stepped by both; three initialisations.",
        corpora=["corpus/debian-ende", "corpus/debian-ende-by-source"],
        smoke={"precision": ["fp32"]},
        timeout_s=7200,
    ),
    _peer(
        "peer_fairseq_speed",
        "paperscale (fp32, and in auto's precision) against fairseq (fp32, its only CPU "
        "precision) on the demo recipe, side by side on the same shuffled corpus, model and "
        "batch: target tokens/s and their ratio, training and validation nll at 400 steps.",
        full={"controlled": False, "precision": ["fp32", "auto"]},
        smoke={"controlled": False},
        timeout_s=3600,
    ),
    Bench(
        "gpu",
        "The big model on one GPU at the paper's batch: tokens/s, MFU and peak memory, ZeRO 1 "
        "and 2, with and without torch.compile.",
        run=("bash", "bench/gpu.sh"),
        env={"PYTHON": "{python}"},
        timeout_s=900,
        smoke_timeout_s=960,
        needs=_needs_cuda,
    ),
    Bench(
        "attention",
        "SDPA kernels side by side: forward + backward ms of each at the demo preset's "
        "attention shapes, fp32 and (where native) bf16; the figures behind `train.attention: "
        "auto`.",
        "attention:measure",
        smoke={"smoke": True},
        timeout_s=1200,
        smoke_timeout_s=120,
    ),
    Bench(
        "attention_gpu",
        "SDPA kernels side by side on a GPU at the big preset's attention shapes (math, flash, "
        "memory-efficient, cuDNN and torch's own choice): the figures behind `auto` on CUDA.",
        "attention:measure",
        full={"config": "configs/big.yaml"},
        smoke={"config": "configs/big.yaml", "smoke": True},
        timeout_s=300,
        smoke_timeout_s=120,
        needs=_needs_cuda,
    ),
    *_studies(),
)


def by_name(names: Sequence[str] | None) -> list[Bench]:
    """The registered benches called `names` (all when None), in registry order; ValueError
    naming any unknown one."""
    if not names:
        return list(REGISTRY)
    known = {b.name for b in REGISTRY}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown bench(es) {', '.join(unknown)}; known: {', '.join(known)}")
    return [b for b in REGISTRY if b.name in names]


def find(name: str) -> Bench | None:
    """The registered bench called `name`, or None."""
    return next((b for b in REGISTRY if b.name == name), None)


def names() -> list[str]:
    """The registered benches' names, in registry order."""
    return [b.name for b in REGISTRY]


def print_registry(out: TextIO = sys.stdout) -> None:
    """Each bench's name, full command and smoke command ({python}: this interpreter, {json}:
    the rows file, {work}: the bench's scratch directory)."""
    for b in REGISTRY:
        env = "".join(f"{k}={v} " for k, v in b.env.items())
        out.write(f"{b.name}: {b.about}\n  full:  {env}{' '.join(b.command(False))}")
        out.write("".join(f" {k}={v}" for k, v in b.full.items()) + "\n")
        out.write(f"  smoke: {env}{' '.join(b.command(True))}")
        out.write("".join(f" {k}={v}" for k, v in b.smoke.items()) + "\n")
