"""Bad input, one case per row: exit code 2, one line on stderr naming the problem, no
traceback, nothing written or changed anywhere (an existing run dir included), and no code run
by unpickling a crafted checkpoint file.

The cases run the real `paperscale` entry point (`launch.cli.main`) in this process, so that the
table stays fast; the run dirs are copies of the faults' reference run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from launch.cli import main
from tests.integration.faults.conftest import CONFIG, ROOT, overrides

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MARKER = "code-was-run"


class RunsCode:
    """Unpickling this runs a shell command (what a malicious checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# A case prepares files under `tmp` (a copy of the reference run is at tmp/run, its export at
# tmp/run/model) and returns the arguments of `paperscale`.
Case = Callable[[Path, Path], list[str]]


def train(tmp: Path, data: Path, *extra: str) -> list[str]:
    return ["train", "--config", str(CONFIG), "--run-dir", str(tmp / "run"),
            *overrides(data), *extra]  # fmt: skip


def latest(tmp: Path) -> Path:
    ckpt = tmp / "run" / "checkpoints"
    return ckpt / (ckpt / "latest").read_text().strip()


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def code_pickle(path: Path) -> None:
    torch.save({"module": RunsCode(path.parents[3] / MARKER)}, path)


def set_up(action: Callable[[Path], None], where: Callable[[Path], Path]) -> Callable[[Path], None]:
    return lambda tmp: action(where(tmp))


def optim_file(tmp: Path) -> Path:
    return next(latest(tmp).glob("*optim_states.pt"))


CASES: list[tuple[str, Callable[[Path], None] | None, Case, str]] = [
    # (id, file preparation, arguments, what the one line must name)
    ("type-int", None, lambda t, d: train(t, d, "model.d_model=abc"), "model.d_model"),
    ("type-float-for-int", None, lambda t, d: train(t, d, "train.max_steps=1.5"),
     "train.max_steps"),
    ("type-bool", None, lambda t, d: train(t, d, "logging.tensorboard=maybe"),
     "logging.tensorboard"),
    ("negative-steps", None, lambda t, d: train(t, d, "train.max_steps=-1"), "train.max_steps"),
    ("zero-tokens", None, lambda t, d: train(t, d, "data.max_tokens=0"), "data.max_tokens"),
    ("zero-timeout", None, lambda t, d: train(t, d, "train.dist_timeout_s=0"),
     "train.dist_timeout_s"),
    ("zero-max-nonfinite", None, lambda t, d: train(t, d, "train.max_nonfinite=0"),
     "train.max_nonfinite"),
    ("negative-keep", None, lambda t, d: train(t, d, "train.keep_last=-2"), "train.keep_last"),
    ("heads-not-dividing", None, lambda t, d: train(t, d, "model.n_heads=3"), "model.d_model"),
    ("zero-nproc", None, lambda t, d: [*train(t, d), "--nproc", "0"], "--nproc"),
    ("missing-config", None,
     lambda t, d: ["train", "--config", str(t / "nope.yaml"), "--run-dir", str(t / "run")],
     "nope.yaml"),
    ("config-not-yaml", lambda t: (t / "bad.yaml").write_text("model: [1, 2\n  x: {"),
     lambda t, d: ["train", "--config", str(t / "bad.yaml"), "--run-dir", str(t / "run")],
     "bad.yaml"),
    ("missing-data", None, lambda t, d: train(t, d, f"data.dir={t / 'nodata'}"), "data.dir"),
    ("resume-other-width", None,
     lambda t, d: train(t, d, "model.d_model=64", "model.d_ff=128"), "model.d_model"),
    ("resume-other-depth", None, lambda t, d: train(t, d, "model.decoder_layers=2"),
     "model.decoder_layers"),
    ("resume-other-precision", None, lambda t, d: train(t, d, "train.precision=fp32"),
     "train.precision"),
    ("not-a-checkpoint", set_up(garbage, lambda t: latest(t) / "mp_rank_00_model_states.pt"),
     lambda t, d: train(t, d), "mp_rank_00_model_states.pt is not a readable torch"),
    ("truncated-optimizer-file", set_up(truncate, optim_file), lambda t, d: train(t, d),
     "optim_states.pt is not a readable torch"),
    ("pickle-runs-code-resume", set_up(code_pickle, lambda t: latest(t) / "rank_00000.pt"),
     lambda t, d: train(t, d), "run code"),
    ("pickle-runs-code-export", set_up(code_pickle, optim_file),
     lambda t, d: ["export", str(t / "run"), "--out", str(t / "out")], "run code"),
    ("latest-names-nothing",
     lambda t: (t / "run/checkpoints/latest").write_text("step_00000099\n"),
     lambda t, d: train(t, d), "step_00000099"),
    ("meta-not-json", set_up(garbage, lambda t: latest(t) / "meta.json"),
     lambda t, d: train(t, d), "meta.json"),
    ("translate-truncated-safetensors",
     set_up(truncate, lambda t: t / "run/model/model.safetensors"),
     lambda t, d: ["translate", str(t / "run"), "--input", str(ROOT / "README.md")],
     "model.safetensors is not a readable safetensors file"),
    ("evaluate-truncated-safetensors",
     set_up(truncate, lambda t: t / "run/model/model.safetensors"),
     lambda t, d: ["evaluate", str(t / "run"), "--data", str(d), "--limit", "2"],
     "model.safetensors is not a readable safetensors file"),
    ("translate-other-shape",
     lambda t: (t / "run/model/model.json").write_text(
         (t / "run/model/model.json").read_text().replace('"d_ff": 64', '"d_ff": 128')),
     lambda t, d: ["translate", str(t / "run"), "--input", str(ROOT / "README.md")],
     "does not match"),
    ("translate-missing-model", None, lambda t, d: ["translate", str(t / "nothing")],
     "neither an export dir"),
    ("translate-zero-beam", None,
     lambda t, d: ["translate", str(t / "run"), "--beam", "0"], "--beam"),
    ("export-unknown-tag", None,
     lambda t, d: ["export", str(t / "run"), "--tag", "step_00000099"], "step_00000099"),
    ("export-not-a-run", None, lambda t, d: ["export", str(t / "nothing")], "not a run dir"),
    ("average-zero", None, lambda t, d: ["average", str(t / "run"), "--last", "0"], "--last"),
    ("prepare-missing-corpus", None,
     lambda t, d: ["prepare", str(t / "nocorpus"), str(t / "out")], "nocorpus"),
    ("submit-unknown-cluster", None,
     lambda t, d: ["submit", "--config", str(CONFIG), "--cluster",
                   str(ROOT / "configs/clusters/nope.yaml"), "--run-dir", str(t / "run2")],
     "nope"),
]  # fmt: skip


@pytest.fixture
def restore_torch_load_env() -> object:
    saved = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    yield
    if saved is None:
        os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
    else:
        os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = saved


@pytest.mark.parametrize(("prepare", "case", "names"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_input_exits_2_with_one_line(
    reference_run: Path,
    synthetic_data: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    restore_torch_load_env: object,
    prepare: Callable[[Path], None] | None,
    case: Case,
    names: str,
) -> None:
    shutil.copytree(reference_run, tmp_path / "run", ignore=shutil.ignore_patterns("wandb", "tb"))
    if prepare is not None:
        prepare(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    before = snapshot(tmp_path)
    capsys.readouterr()
    try:
        code = main(case(tmp_path, synthetic_data))
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert names in lines[0], lines[0]
    assert "Traceback" not in err
    assert snapshot(tmp_path) == before  # nothing written, nothing changed
    assert not (tmp_path / MARKER).exists()  # nothing unpickled ran code
