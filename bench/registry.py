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
    """One registered bench, declared once: its program and the arguments of each size.

    The full command is `run + full + both + --json {json}`, the smoke one `run + --smoke +
    smoke + both + --json {json}`; argument lists run from the repository root, `{python}` is
    this interpreter, `{json}` the rows file the suite reads, `{work}` a scratch directory of
    this bench's own. `env` is set for the run (and shown with the command). `needs` says why
    the full run cannot happen on this machine (None: it can); a smoke run is always possible.
    """

    name: str
    about: str
    run: tuple[str, ...]
    full_args: tuple[str, ...] = dataclasses.field(default=(), kw_only=True)
    smoke_args: tuple[str, ...] = dataclasses.field(default=(), kw_only=True)
    both: tuple[str, ...] = dataclasses.field(default=(), kw_only=True)
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: ONE_THREAD, kw_only=True)
    timeout_s: float = dataclasses.field(default=1800, kw_only=True)
    smoke_timeout_s: float = dataclasses.field(default=300, kw_only=True)
    needs: Callable[[], str | None] = dataclasses.field(default=_always, kw_only=True)

    @property
    def full(self) -> tuple[str, ...]:
        return (*self.run, *self.full_args, *self.both, "--json", "{json}")

    @property
    def smoke(self) -> tuple[str, ...]:
        return (*self.run, "--smoke", *self.smoke_args, *self.both, "--json", "{json}")

    def command(self, smoke: bool) -> tuple[str, ...]:
        return self.smoke if smoke else self.full


STUDIES = ROOT / "configs" / "bench"


def _studies() -> tuple[Bench, ...]:
    """One bench per study in configs/bench/ (bench/study.py runs it)."""
    from omegaconf import OmegaConf

    out = []
    for path in sorted(STUDIES.glob("*.yaml")):
        study = OmegaConf.load(path)
        out.append(
            Bench(
                path.stem,
                " ".join(str(study.about).split()),
                ("{python}", "-m", "bench.study", str(path.relative_to(ROOT))),
                both=("--work", "{work}"),
                env=CPU_RANKS,
                timeout_s=float(study.get("timeout", 1800))
                * len(study.arms)
                * study.get("rounds", 1),
                smoke_timeout_s=420,
                needs=needs_paths(study.needs) if "needs" in study else _always,
            )
        )
    return tuple(out)


def _checkpoint(name: str, what: str, preset: str, **kw: Any) -> Bench:
    """bench/checkpoint.py on a preset, under torchrun on 2 CPU ranks."""
    return Bench(
        name,
        f"Checkpoint size and save / load seconds of {what} on 2 CPU ranks, against "
        "`paperscale plan`'s estimate.",
        (*TORCHRUN, "-m", "bench.checkpoint"),
        full_args=("--config", f"configs/{preset}.yaml"),
        env=CPU_RANKS,
        **kw,
    )


def _peer(
    name: str, about: str, corpora: tuple[str, ...], both: tuple[str, ...], **kw: Any
) -> Bench:
    """bench/peer_fairseq.py against fairseq's venv on the Debian corpus (and `corpora`)."""
    return Bench(
        name,
        about,
        ("{python}", "-m", "bench.peer_fairseq"),
        full_args=(
            "--fairseq-python",
            ".venv-fairseq/bin/python",
            "--corpus",
            "corpus/debian-ende",
            *corpora,
        ),
        both=(*both, "--work", "{work}"),
        env=CPU_RANKS,
        smoke_timeout_s=420,
        needs=FAIRSEQ,
        **kw,
    )


REGISTRY: tuple[Bench, ...] = (
    Bench(
        "decode",
        "Decoding sentences/s of greedy and beam 4 search, with and without the key/value cache.",
        ("{python}", "-m", "bench.decode"),
        smoke_timeout_s=120,
    ),
    Bench(
        "decode_mixed",
        "Decoding sentences/s (cache on) of a batch of varied source lengths, each sentence "
        "ending at its own maximum length.",
        ("{python}", "-m", "bench.decode", "--mixed"),
        smoke_timeout_s=120,
    ),
    Bench(
        "engines",
        "Serving engines on the demo model: sentences/s, test BLEU and outputs equal to ours, "
        "for paperscale, Transformers and CTranslate2 (fp32, int8), beam 4.",
        ("{python}", "-m", "bench.decode"),
        full_args=("--engines", "runs/demo", "--data", "data/debian-ende"),
        smoke_args=("--engines-smoke",),
        both=("--threads", "1"),
        timeout_s=3600,
        needs=DEMO_RUN,
    ),
    Bench(
        "data",
        "Data pipeline: shard bytes per sample, loader tokens/s, padding at a 4,096-token "
        "budget, prepare pairs/s and peak memory.",
        ("{python}", "-m", "bench.data"),
        full_args=("--corpus", "corpus/debian-ende"),
        both=("--work", "{work}"),
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
        ("{python}", "-m", "bench.plan_calibration", "--out", "{work}/plan-calibration.json"),
        timeout_s=900,
        smoke_timeout_s=120,
    ),
    Bench(
        "batch_scaling",
        "Steps and training seconds to the same valid nll at B and 2B target tokens per step "
        "(peak lr x sqrt 2), demo preset's model on 2 CPU ranks.",
        ("{python}", "-m", "bench.batch_scaling"),
        full_args=("--data", "data/debian-ende", "--steps", "150"),
        both=("--work", "{work}"),
        env=CPU_RANKS,
        timeout_s=3600,
        smoke_timeout_s=400,
        needs=DEMO_DATA,
    ),
    _checkpoint("checkpoint_big", "the big model", "big", smoke_args=("train.zero_stage=1",)),
    Bench(
        "loss_memory",
        "Peak memory of the output projection and loss, forward and backward, at the base "
        "preset: logits materialised against the chunked loss.",
        ("{python}", "-m", "bench.loss_memory"),
        timeout_s=900,
    ),
    Bench(
        "preemption",
        "Seconds from SIGTERM to every process of a 2-rank run to its checkpoint and exit 75, "
        "tiny and base presets.",
        ("{python}", "-m", "bench.preemption", "--work", "{work}"),
        env=CPU_RANKS,
        needs=DEMO_DATA,
    ),
    Bench(
        "zero_memory",
        "Measured per-rank memory of the model states under ZeRO 0-3 on 1 and 2 ranks against "
        "`paperscale plan`.",
        ("{python}", "-m", "bench.zero_memory"),
        full_args=("--config", "configs/base.yaml"),
        smoke_args=("--timeout", "300"),
        env=CPU_RANKS,
        timeout_s=3600,
        smoke_timeout_s=420,
    ),
    Bench(
        "train_overhead",
        "Tokens/s of the paperscale training step against a bare PyTorch loop, same batches and"
        " precision.",
        ("{python}", "-m", "bench.train_overhead", "--work", "{work}"),
        env=CPU_RANKS,
        timeout_s=3600,
    ),
    _peer(
        "peer_fairseq",
        "paperscale against fairseq on the demo recipe, same data, model and machine: training "
        "and validation nll, target tokens/s (shuffled and source-ordered input); the same "
        "weights and batches stepped by both; three initialisations.",
        ("--corpus", "corpus/debian-ende-by-source"),
        (),
        timeout_s=7200,
    ),
    _peer(
        "peer_fairseq_speed",
        "paperscale (fp32, and in auto's precision) against fairseq (fp32, its only CPU "
        "precision) on the demo recipe, side by side on the same shuffled corpus, model and "
        "batch: target tokens/s and their ratio, training and validation nll at 400 steps.",
        (),
        ("--no-controlled", "--precision", "fp32", "--precision", "auto"),
        timeout_s=3600,
    ),
    Bench(
        "gpu",
        "The big model on one GPU at the paper's batch: tokens/s, MFU and peak memory, ZeRO 1 "
        "and 2, with and without torch.compile.",
        ("bash", "bench/gpu.sh"),
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
        ("{python}", "-m", "bench.attention"),
        timeout_s=1200,
        smoke_timeout_s=120,
    ),
    Bench(
        "attention_gpu",
        "SDPA kernels side by side on a GPU at the big preset's attention shapes (math, flash, "
        "memory-efficient, cuDNN and torch's own choice): the figures behind `auto` on CUDA.",
        ("{python}", "-m", "bench.attention", "--config", "configs/big.yaml"),
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
        out.write(f"{b.name}\n  full:  {env}{' '.join(b.full)}\n")
        out.write(f"  smoke: {env}{' '.join(b.smoke)}\n")
