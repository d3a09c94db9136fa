"""The bench registry: every bench declared once, in configs/bench/NAME.yaml (the keys are
`Bench`'s fields; a file without `measure` is a study, bench/study.py). `python -m bench.suite
--list` prints them."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
DECLARED = ROOT / "configs" / "bench"
RESULTS = ROOT / "bench" / "RESULTS.md"
FULL_WORK = Path(tempfile.gettempdir()) / "paperscale-bench"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# what writes each input a full-size bench may need
MADE_BY = {
    "corpus/": "`make bench` fetches it",
    "data/debian-ende": "`make demo` prepares it",
    "runs/demo": "`make demo` trains and writes it",
    ".venv-fairseq": "`make fairseq-venv` installs fairseq beside torch",
}


@dataclasses.dataclass(frozen=True)
class Bench:
    """One registered bench. It runs as `python -m bench NAME` (under torchrun when `ranks` >
    1), which calls `measure` ("module:function" in bench/) with the keyword arguments `full`
    or `smoke`; or as a program of its own (`run`). In a command `{python}` is this
    interpreter, `{json}` the rows file, `{work}` the bench's scratch directory."""

    name: str
    about: str  # what it measures, the first line of its RESULTS.md section
    measure: str = "study:run_study"
    full: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    smoke: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # seconds, in CI
    ranks: int = 1
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: ONE_THREAD)
    timeout_s: float = 1800
    smoke_timeout_s: float = 300
    needs: Sequence[str] = ()  # what the full size needs: paths, or `cuda`
    run: Sequence[str] = ()

    def command(self, smoke: bool) -> tuple[str, ...]:
        size = ("--smoke",) if smoke else ()
        if self.run:
            return (*self.run, *size, "--json", "{json}")
        launcher = ("{python}",)
        if self.ranks > 1:
            launcher += ("-m", "torch.distributed.run", "--standalone",
                         f"--nproc_per_node={self.ranks}")  # fmt: skip
        return (*launcher, "-m", "bench", self.name, *size, "--work", "{work}", "--json", "{json}")

    def missing(self) -> str | None:
        """Why the full run cannot happen on this machine, or None."""
        for need in self.needs:
            if need == "cuda":
                import torch

                if not torch.cuda.is_available():
                    why = "torch.cuda.is_available() is False; `--smoke` runs its CPU path"
                    return f"no CUDA device ({why})"
            elif not (ROOT / need).exists():
                made_by = next((m for p, m in MADE_BY.items() if need.startswith(p)), "")
                return f"{need} is missing ({made_by})"
        return None


def declared(path: Path) -> Bench:
    """The bench that `path` (configs/bench/NAME.yaml) declares."""
    d = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(d, dict), path
    about = " ".join(str(d.pop("about")).split())
    if "measure" not in d:  # a study: its own file, on 2 CPU ranks per arm
        runs = len(d["arms"]) * d.get("rounds", 1)
        where = {"path": str(path.relative_to(ROOT))}
        return Bench(path.stem, about, full=where, smoke={**where, "smoke": True},
                     env={**ONE_THREAD, "DS_ACCELERATOR": "cpu"},
                     timeout_s=float(d.get("timeout", 1800)) * runs, smoke_timeout_s=420,
                     needs=[d["needs"]] if "needs" in d else [])  # fmt: skip
    env = {str(k): str(v) for k, v in d.pop("env", ONE_THREAD).items()}
    return Bench(path.stem, about, env=env, **d)


REGISTRY: dict[str, Bench] = {
    b.name: b for b in (declared(p) for p in sorted(DECLARED.glob("*.yaml")))
}


def by_name(names: Sequence[str] | None) -> list[Bench]:
    """The benches called `names` (all when None); ValueError naming an unknown one."""
    unknown = [n for n in names or () if n not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown bench(es) {', '.join(unknown)}; known: {', '.join(REGISTRY)}")
    return [b for b in REGISTRY.values() if not names or b.name in names]


def print_registry(out: TextIO = sys.stdout) -> None:
    """Each bench's name, what it measures, and its full and smoke commands and arguments."""
    for b in REGISTRY.values():
        env = "".join(f"{k}={v} " for k, v in b.env.items())
        out.write(f"{b.name}: {b.about}\n")
        for size, args in (("full: ", b.full), ("smoke:", b.smoke)):
            kw = "".join(f" {k}={v}" for k, v in args.items())
            out.write(f"  {size} {env}{' '.join(b.command(size == 'smoke:'))}{kw}\n")
