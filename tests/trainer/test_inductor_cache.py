"""Inductor's cache is kept apart per ATEN_CPU_CAPABILITY (trainer.ds.engine): torch's cache keys
miss that variable, and kernels compiled under ATEN_CPU_CAPABILITY=avx2 crashed a process
without it (heap corruption, exit -6; or a NaN) when both used the default cache directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, cli_env
from trainer import inductor_cache_for_this_cpu_capability

# a compiled bf16 -> fp32 log_softmax, through the trainer's cache choice; its result and eager's
COMPILED = """
import torch
from trainer import inductor_cache_for_this_cpu_capability
inductor_cache_for_this_cpu_capability()
torch.manual_seed(0)
x = torch.randn(64, 32, dtype=torch.bfloat16)
def f(x):
    return torch.nn.functional.log_softmax(x.float(), -1).sum()
print(float(torch.compile(f, dynamic=False)(x)), float(f(x)))
"""


def test_the_cache_directory_follows_the_cpu_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    inductor_cache_for_this_cpu_capability()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # torch's default
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    inductor_cache_for_this_cpu_capability()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith("_avx2")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/chosen")
    inductor_cache_for_this_cpu_capability()  # a directory the user set is theirs
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/chosen"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kernels_compiled_under_avx2_do_not_reach_a_process_without_it(tmp_path: Path) -> None:
    env = {**cli_env(), "TMPDIR": str(tmp_path)}  # the default cache directories under tmp_path
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("ATEN_CPU_CAPABILITY", None)
    for extra in ({"ATEN_CPU_CAPABILITY": "avx2"}, {}):
        proc = subprocess.run([sys.executable, "-c", COMPILED], cwd=ROOT, env={**env, **extra},
                              capture_output=True, text=True, timeout=280)  # fmt: skip
        assert proc.returncode == 0, (extra, proc.returncode, proc.stderr[-2000:])
        compiled, eager = map(float, proc.stdout.split())
        assert compiled == pytest.approx(eager, rel=1e-4), extra
    caches = sorted(p.name for p in tmp_path.glob("torchinductor_*"))
    assert len(caches) == 2 and caches[1].endswith("_avx2"), caches
