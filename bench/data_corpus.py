"""Corpora and ``prepare`` runs for bench/data.py: ``prepare`` in a fresh subprocess with its
timings and peak memory (main process, largest child, the summed PSS of the process tree),
training corpora of a given number of pairs made from a real one, and the small synthetic
corpus of ``--smoke``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    """One time-stamped progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# prepare in a subprocess, with its memory


_PREPARE_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from data_pipeline.prepare import prepare
args = json.loads(sys.argv[1])
marks = []
t0 = time.monotonic()
def log(msg):
    marks.append([time.monotonic() - t0, msg])
print(json.dumps({"t0": t0}), flush=True)
m = prepare(Path(args["corpus"]), Path(args["out"]), log=log, progress=False, **args["kw"])
self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"wall": time.monotonic() - t0, "marks": marks, "main_kb": self_kb,
                  "worker_kb": child_kb, "manifest": m}))
"""


def _tree_rss(pid: int) -> int:
    """Sum of the PSS (bytes) of a process and its descendants, from /proc."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with the dev tools
        return 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            # PSS: pages shared after fork (copy-on-write) are counted once in the sum.
            total += p.memory_full_info().pss
    return total


def run_prepare(corpus: Path, out: Path, **kw: Any) -> dict[str, Any]:
    """``prepare`` in a fresh subprocess; its result, timings and peak memory."""
    shutil.rmtree(out, ignore_errors=True)
    args = json.dumps({"corpus": str(corpus), "out": str(out), "kw": kw})
    proc = subprocess.Popen(
        [sys.executable, "-c", _PREPARE_CHILD, args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    timeline: list[tuple[float, int]] = []  # (monotonic time, tree PSS)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            timeline.append((time.monotonic(), _tree_rss(proc.pid)))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, _ = proc.communicate()
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"prepare of {corpus} failed with exit code {proc.returncode}")
    lines = stdout.decode().strip().splitlines()
    t0 = json.loads(lines[0])["t0"]  # the child's start on the same monotonic clock
    res = json.loads(lines[-1])
    marks = res["marks"]
    spm_done = next(t for t, m in marks if "sentencepiece trained" in m)
    train_done = next(t for t, m in marks if m.startswith("prepare: train:"))
    res["tree_peak"] = max((m for _, m in timeline), default=0)
    res["spm_peak"] = max((m for t, m in timeline if t - t0 <= spm_done), default=0)
    res["shard_peak"] = max((m for t, m in timeline if t - t0 > spm_done), default=0)
    train = res["manifest"]["splits"]["train"]
    res["spm_s"] = spm_done
    res["shard_s"] = train_done - spm_done
    res["lines"] = train["cleaning"]["lines"]
    res["bytes_per_sample"] = sum(s["bytes"] for s in train["shards"]) / max(1, train["samples"])
    return res


def make_corpus(real: Path, out: Path, pairs: int) -> Path:
    """``pairs`` training pairs from ``real``'s (repetition r rotates the words by r) plus its
    valid/test files."""
    out.mkdir(parents=True, exist_ok=True)
    done = out / "n"
    if (out / "train.en").is_file() and done.is_file() and done.read_text() == str(pairs):
        return out
    en = (real / "train.en").read_text(encoding="utf-8").splitlines()
    de = (real / "train.de").read_text(encoding="utf-8").splitlines()

    def rotate(line: str, r: int) -> str:
        words = line.split()
        k = r % len(words) if words else 0
        return " ".join(words[k:] + words[:k])

    with (
        open(out / "train.en", "w", encoding="utf-8") as fe,
        open(out / "train.de", "w", encoding="utf-8") as fd,
    ):
        for n in range(pairs):
            r, i = divmod(n, len(en))
            fe.write((rotate(en[i], r) if r else en[i]) + "\n")
            fd.write((rotate(de[i], r) if r else de[i]) + "\n")
    for split in ("valid", "test"):
        for lang in ("en", "de"):
            if (real / f"{split}.{lang}").is_file():
                shutil.copyfile(real / f"{split}.{lang}", out / f"{split}.{lang}")
    (out / "n").write_text(str(pairs))
    return out


def smoke_corpus(work: Path) -> Path:
    """A small synthetic corpus (train/valid/test .en/.de) under `work`, written once."""
    from data_pipeline.corpus.synthetic import write_synthetic

    out = work / "corpus-smoke"
    if not (out / "corpus.json").is_file():
        write_synthetic(out, n_train=2000, n_valid=50, n_test=50, seed=1)
    return out
