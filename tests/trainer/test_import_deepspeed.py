"""DeepSpeed imported without inductor: its Muon module's torch.compile waits for a first call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from trainer.ds.engine import compile_on_first_call

ROOT = Path(__file__).resolve().parents[2]


def test_the_stand_in_compiles_once_at_the_first_call_in_both_forms() -> None:
    compiled: list[tuple[Any, dict[str, Any]]] = []

    def compile_now(fn: Any, **kwargs: Any) -> Any:
        compiled.append((fn, kwargs))
        return lambda *a, **k: ("compiled", fn(*a, **k))

    lazy = compile_on_first_call(compile_now)

    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    plain = lazy(double)
    with_kwargs = lazy(mode="max-autotune")(double)
    assert compiled == []  # nothing compiled at decoration
    assert plain.__name__ == "double" and plain.__doc__ == "Twice x."
    assert plain(3) == ("compiled", 6) and plain(4) == ("compiled", 8)
    assert compiled == [(double, {})]  # once, at the first call
    assert with_kwargs(5) == ("compiled", 10)
    assert compiled == [(double, {}), (double, {"mode": "max-autotune"})]


def test_import_deepspeed_loads_muon_without_inductor_and_restores_torch_compile() -> None:
    code = (
        "import sys, torch\n"
        "real = torch.compile\n"
        "from trainer.ds.engine import MUON_MODULE, import_deepspeed\n"
        "import_deepspeed()\n"
        "assert MUON_MODULE in sys.modules\n"
        "assert torch.compile is real, 'torch.compile not restored'\n"
        "from deepspeed.runtime.zero.muon import original_muon\n"
        "fn = original_muon.zeropower_via_newtonschulz5\n"
        "assert hasattr(fn, '__wrapped__'), fn  # deferred, not compiled\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._inductor'))[:3])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"  # no inductor module imported
