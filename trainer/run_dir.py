"""The layout of a run directory: every name in it, and how to read what the layout says.

```
RUN/config.yaml                 the resolved config (the precision it trains in, once started)
RUN/decisions.json              every `auto` as the run's first start resolved it (trainer/autos.py)
RUN/spm.model                   the run's copy of the tokenizer
RUN/metrics.jsonl               one JSON object per logged step / evaluation
RUN/summary.json                how the last `train` ended (exit code, error, figures)
RUN/attempts.jsonl              every start of the worker group and how it ended
RUN/tb/  RUN/wandb/             TensorBoard events, the wandb run
RUN/report.png                  curves of metrics.jsonl
RUN/profile/step_<first>-<last>/   `profile.enabled`: traces and tables (trainer/profiler.py)
RUN/model/  RUN/averageK/       exports (trainer/export.py)
RUN/hf/  RUN/ct2-<quantization>/   Transformers and CTranslate2 exports (serve/)
RUN/eval_<split>.json  RUN/<split>.hyp.txt   `evaluate`'s scores and translations
RUN/job.sbatch  RUN/slurm.json  RUN/logs/slurm-<jobid>.out   `submit`
RUN/logs/startup-failed-<jobid>.<restart>.<try>-node<n>.txt   a torchrun that started no rank
RUN/logs/watchdog-<attempt>-rank<r>.txt   the stacks of a rank whose watchdog ended it
RUN/logs/start-<attempt>-rank<r>.txt   where a rank is in its start-up (trainer/startup.py)
RUN/logs/torchrun/<id>_<x>/attempt_<n>/<rank>/   torchrun's records (a failed rank's error.json)
RUN/checkpoints/step_00000100/  DeepSpeed's files, meta.json, rank_00000.pt ..., complete
RUN/checkpoints/latest          the tag of the newest complete checkpoint (written last)
RUN/checkpoints/universal/<tag>/  the tag converted for another number of ranks
```

Nothing else in the project spells these names; other modules ask a `RunDir` or a
`CheckpointDir` for paths, and `CheckpointDir.inspect_latest` for a strict reading of `latest`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file, fsync it and rename it over `path`."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


CONFIG = "config.yaml"
DECISIONS = "decisions.json"
TOKENIZER = "spm.model"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
REPORT = "report.png"
PLAN = "plan.json"  # `paperscale plan --json` of the run's config, for `report` to compare
TENSORBOARD = "tb"
PROFILE = "profile"
WANDB = "wandb"
MODEL = "model"
JOB_SCRIPT = "job.sbatch"
SLURM_RECORD = "slurm.json"
LOGS = "logs"
REPORTED_SUFFIX = ".reported.txt"  # a watchdog's stacks once trainer/attempts.py reported them
CHECKPOINTS = "checkpoints"
LATEST = "latest"
COMPLETE = "complete"
META = "meta.json"
UNIVERSAL = "universal"
TAG_PREFIX = "step_"


class LayoutError(ValueError):
    """The run dir does not hold what its layout promises; `str()` is one line."""


def tag_for(step: int) -> str:
    """The checkpoint tag of optimizer step `step`: step_00000100."""
    return f"{TAG_PREFIX}{step:08d}"


def step_of(tag: str) -> int:
    return int(tag.split("_", 1)[1])


@dataclass(frozen=True)
class CheckpointDir:
    """RUN/checkpoints: one directory per tag, `latest`, and universal conversions."""

    root: Path

    def tag_dir(self, tag: str) -> Path:
        return self.root / tag

    @property
    def latest_file(self) -> Path:
        return self.root / LATEST

    def complete_marker(self, tag: str) -> Path:
        return self.root / tag / COMPLETE

    def meta_file(self, tag: str) -> Path:
        return self.root / tag / META

    def rank_file(self, tag: str, rank: int) -> Path:
        """One rank's own state (data position, RNG) in checkpoint `tag`."""
        return self.root / tag / f"rank_{rank:05d}.pt"

    def rank_files(self, tag: str) -> list[Path]:
        return sorted((self.root / tag).glob("rank_*.pt"))

    @property
    def universal_root(self) -> Path:
        return self.root / UNIVERSAL

    def is_complete(self, tag: str) -> bool:
        return self.complete_marker(tag).is_file()

    def latest_tag(self) -> str | None:
        """The tag `latest` names, if that checkpoint directory exists."""
        if not self.latest_file.is_file():
            return None
        tag = self.latest_file.read_text().strip()
        return tag if tag and self.tag_dir(tag).is_dir() else None

    def complete_tags(self) -> list[str]:
        """Tags of finished checkpoints, oldest first (finished: the marker exists)."""
        if not self.root.is_dir():
            return []
        tags = [
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and p.name.startswith(TAG_PREFIX) and self.is_complete(p.name)
        ]
        return sorted(tags, key=step_of)

    def saved_world_size(self, tag: str) -> int:
        """How many ranks wrote checkpoint `tag` (one rank file each)."""
        return len(self.rank_files(tag))

    def read_meta(self, tag: str) -> dict[str, Any]:
        """meta.json of `tag` (the model's shape and the resolved config), strictly."""
        path = self.meta_file(tag)
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise LayoutError(
                f"{path} is missing or not JSON, so {self.tag_dir(tag)} is not a paperscale "
                f"checkpoint ({str(exc).splitlines()[0]})"
            ) from None
        if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
            raise LayoutError(f"{path} does not describe a model")
        return meta

    def inspect_latest(self) -> str | None:
        """The tag `latest` names, None without one, and LayoutError when it names nothing
        usable (unreadable, not a checkpoint dir, or a checkpoint without its marker)."""
        if not self.latest_file.exists():
            return None
        try:
            tag = self.latest_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise LayoutError(f"{self.latest_file} is not readable: {exc}") from None
        if not tag or "/" in tag or not self.tag_dir(tag).is_dir():
            raise LayoutError(f"{self.latest_file} names {tag!r}, which is not a checkpoint dir")
        if not self.is_complete(tag):
            raise LayoutError(f"{self.tag_dir(tag)} has no '{COMPLETE}' marker")
        return tag

    def exportable_tags(self) -> list[str]:
        """Complete tags up to `latest` (a newer directory may be an unfinished save)."""
        tags = self.complete_tags()
        newest = self.latest_tag()
        if newest is None:
            return tags
        return [t for t in tags if step_of(t) <= step_of(newest)]


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory (see the module docstring)."""

    root: Path

    @property
    def checkpoints(self) -> CheckpointDir:
        return CheckpointDir(self.root / CHECKPOINTS)

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def decisions(self) -> Path:
        return self.root / DECISIONS

    @property
    def tokenizer(self) -> Path:
        return self.root / TOKENIZER

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def attempts(self) -> Path:
        """The record of the run's attempts (trainer/attempts.py)."""
        return self.root / "attempts.jsonl"

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def plan(self) -> Path:
        return self.root / PLAN

    def profile(self, first_step: int, last_step: int) -> Path:
        """Where the profiler puts the steps first..last it recorded."""
        return self.root / PROFILE / f"{TAG_PREFIX}{first_step:08d}-{last_step:08d}"

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD

    @property
    def wandb(self) -> Path:
        return self.root / WANDB

    @property
    def model(self) -> Path:
        """The export written when training ends."""
        return self.root / MODEL

    def average(self, k: int) -> Path:
        """`paperscale average --last k`'s export."""
        return self.root / f"average{k}"

    @property
    def hf_export(self) -> Path:
        """`paperscale export --format hf`'s default output."""
        return self.root / "hf"

    def ct2_export(self, quantization: str) -> Path:
        """`paperscale export --format ctranslate2`'s default output."""
        return self.root / f"ct2-{quantization}"

    def eval_result(self, split: str) -> Path:
        return self.root / f"eval_{split}.json"

    def hypotheses(self, split: str) -> Path:
        return self.root / f"{split}.hyp.txt"

    @property
    def job_script(self) -> Path:
        return self.root / JOB_SCRIPT

    @property
    def slurm_record(self) -> Path:
        return self.root / SLURM_RECORD

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    @property
    def torchrun_logs(self) -> Path:
        return self.logs / "torchrun"

    def slurm_log(self, job_id: str) -> Path:
        return self.logs / f"slurm-{job_id}.out"

    def startup_failure(self, job_id: str, restart: str, attempt_try: int, node_id: str) -> Path:
        """Why torchrun on node `node_id` ended before starting a rank, in try `attempt_try`
        of restart `restart` of job `job_id` (launch/slurm/rendezvous.py)."""
        return self.logs / f"startup-failed-{job_id}.{restart}.{attempt_try}-node{node_id}.txt"

    def node_arrival(self, job_id: str, restart: str, attempt_try: int, node_id: str) -> Path:
        """Written by node `node_id`'s task when it reached the rendezvous of that try (its
        host name); a node without one never joined (launch/slurm/rendezvous.py)."""
        return self.logs / f"arrived-{job_id}.{restart}.{attempt_try}-node{node_id}.txt"

    def startup_failures(self, job_id: str, restart: str, attempt_try: int) -> list[Path]:
        return sorted(self.logs.glob(f"startup-failed-{job_id}.{restart}.{attempt_try}-node*.txt"))

    def watchdog_stacks(self, attempt: str, rank: int) -> Path:
        """Every thread's stack of `rank`, written by its watchdog when a phase of the loop ran
        past train.dist_timeout_s in attempt `attempt` (trainer/signals.py; removed when empty)."""
        return self.logs / f"watchdog-{attempt}-rank{rank:05d}.txt"

    def unreported_watchdogs(self) -> list[Path]:
        found = self.logs.glob("watchdog-*-rank*.txt")
        return sorted(p for p in found if not p.name.endswith(REPORTED_SUFFIX))

    def read_summary(self) -> dict[str, Any] | None:
        """summary.json, or None when it is missing or unreadable (a run that never ended)."""
        try:
            summary = json.loads(self.summary.read_text())
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) else None


def run_dir_of_export(export_dir: Path) -> Path:
    """The run dir an export belongs to: RUN for RUN/model, else the export dir itself."""
    return export_dir.parent if export_dir.name == MODEL else export_dir
