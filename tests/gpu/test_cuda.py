"""The CUDA paths, on a GPU (`make test-gpu`; `bash tests/gpu/checks.sh` runs them together with
the GPU benches). Each test names its CPU twin in the suite, which checks the same logic on CPU
ranks; what only a GPU has is checked here: the step's device synchronisations as CUDA counts
them, the fused attention kernels of CUDA, pinned-memory background saves, the allocator's
memory snapshot, and a resume to the sample on the GPU."""

from __future__ import annotations

import json
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from model.attention import attention, build_attn_mask
from tests.integration.conftest import TINY_MODEL, paperscale
from tests.trainer.test_step_syncs import CountReads, engine_for, step
from trainer.dist import DistEnv
from trainer.ds.config import compute_grad_norm_for
from trainer.kernels import sdpa_backends

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(420)]


@contextmanager
def cuda_syncs() -> Iterator[list[str]]:
    """Every synchronising CUDA call made inside (torch's sync debug mode), each as the stack
    that made it."""
    seen: list[str] = []

    def record(message: object, *args: object, **kwargs: object) -> None:
        if "called a synchronizing" in str(message):  # not the mode's own notice
            seen.append(f"{message}\n{''.join(traceback.format_stack(limit=14)[:-2])}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        saved = warnings.showwarning
        warnings.showwarning = record  # type: ignore[assignment]
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield seen
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = saved


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_cuda_step_synchronises_once(cuda_rank: DistEnv, precision: str) -> None:
    """CPU twin: tests/trainer/test_step_syncs.py (host reads counted by a TorchFunctionMode).
    Here CUDA itself counts, on the steps that log no gradient norm (the loop asks DeepSpeed
    for the norm on log steps only: its norm makes two more synchronising calls, a scalar
    copied to the device and a masked_fill_ with a device value): one synchronising call per
    step, the token count's `tolist`."""
    over = [f"train.precision={precision}"]
    from deepspeed.accelerator import get_accelerator

    engine = engine_for(cuda_rank, *over)
    assert next(engine.module.parameters()).is_cuda
    assert compute_grad_norm_for(engine, False)  # as on a step that does not log
    step(engine, cuda_rank, 99)  # the first step: allocations, kernels' first use
    torch.cuda.synchronize()
    accelerator, device_syncs = get_accelerator(), []
    synchronize = accelerator.synchronize
    accelerator.synchronize = lambda *a, **k: device_syncs.append(1) or synchronize(*a, **k)
    try:
        for seed in range(4):  # DeepSpeed's throughput timer would start syncing at step 2
            counter = CountReads()
            with cuda_syncs() as syncs, counter:
                result = step(engine, cuda_rank, seed)
            assert result.completed
            assert dict(counter.reads) == {"tolist": 1}, f"step {seed}: {dict(counter.reads)}"
            assert len(syncs) == 1, f"step {seed}: {len(syncs)} syncs:\n" + "\n".join(syncs)
    finally:
        accelerator.synchronize = synchronize
    assert device_syncs == []


FORMS = ("causal", "padded keys", "no mask")
CUDA_KERNELS = ("flash", "efficient", "cudnn", "default")
# bf16 keeps 8 bits of mantissa (4e-3 relative per rounding), the kernels round in different
# places and sum over up to 37 keys: 3 % of the largest reference value of each tensor
BF16_TOLERANCE = 3e-2


def cuda_case(form: str, dtype: torch.dtype, kernel: str) -> tuple[torch.Tensor, ...]:
    """Output and gradients of the model's attention at a head size of 64 on the GPU."""
    b, h, t, dk = 6, 4, 37, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, t, dk, generator=g) for _ in range(3))  # (B, H, T, Dk)
    q, k, v = (x.cuda().to(dtype).requires_grad_() for x in (q, k, v))
    pad = torch.zeros(b, t, dtype=torch.bool, device="cuda")
    pad[1, 25:] = True
    pad[4, 3:] = True
    kwargs = {
        "causal": {"is_causal": True},
        "padded keys": {"attn_mask": build_attn_mask(pad, t, t, causal=False)},
        "no mask": {},
    }[form]
    out = attention(q, k, v, backends=sdpa_backends(kernel), **kwargs)
    weights = torch.linspace(-1, 1, out.numel(), device="cuda").reshape(out.shape).to(dtype)
    (out * weights).sum().backward()
    return tuple(x.float() for x in (out.detach(), q.grad, k.grad, v.grad))


def test_every_cuda_kernel_matches_math() -> None:
    """CPU twin: tests/model/test_attention_backends.py. bf16 against fp32 math, per form; a
    kernel may refuse a form (flash takes no mask tensor), but torch's own choice (`default`,
    what `train.attention: auto` uses on CUDA) takes all three, and flash takes the causal and
    unmasked forms."""
    taken = {}
    for form in FORMS:
        reference = cuda_case(form, torch.float32, "math")
        for kernel in CUDA_KERNELS:
            try:
                got = cuda_case(form, torch.bfloat16, kernel)
            except RuntimeError:
                continue  # the kernel does not take this case
            taken.setdefault(kernel, []).append(form)
            for name, a, r in zip(("out", "dq", "dk", "dv"), got, reference, strict=True):
                err = ((a - r).abs().max() / r.abs().max()).item()
                assert err <= BF16_TOLERANCE, f"{kernel} {form} {name}: max error {err:.2e}"
    assert taken["default"] == list(FORMS), taken
    assert {"causal", "no mask"} <= set(taken["flash"]), taken
    print(f"kernels and the forms they took: {taken}")


def losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r.get("loss") is not None}


CUDA_ENV = {"DS_ACCELERATOR": "cuda"}  # the CLI's processes on the GPU


def train_on_cuda(run_dir: Path, data: Path, max_steps: int, cwd: Path, *extra: str) -> str:
    proc = paperscale(
        "train", "--config", str(ROOT / "configs/tiny.yaml"), "--nproc", "1",
        "--run-dir", str(run_dir), f"data.dir={data}", *TINY_MODEL, "train.device=cuda",
        "train.precision=bf16", "train.grad_accum=2", "train.zero_stage=2",
        "train.log_every=1", "train.eval_every=4", "train.save_every=4", "train.async_save=true",
        "train.bleu_samples=4", "logging.wandb=disabled", "logging.tensorboard=false",
        "train.compile=false",  # compiled layers: bench gpu's `compile layers` rows
        f"train.max_steps={max_steps}", *extra,
        cwd=cwd, timeout=300, env=CUDA_ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_a_cuda_run_profiles_saves_in_the_background_and_resumes_to_the_sample(
    synthetic_data: Path, tmp_path: Path
) -> None:
    """CPU twins: tests/integration/test_resume_exact.py (bf16, per-step losses bitwise),
    test_profile.py (traces and the grouped table), faults/ (background saves). A straight
    run of 8 steps and one stopped at 4 and resumed: the same loss at every step, bitwise;
    the background save copies to pinned host memory; the profiled steps leave a trace with
    CUDA kernels in it, the table and the allocator's memory snapshot."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    profile = ["profile.enabled=true", "profile.wait_steps=1", "profile.warmup_steps=1",
               "profile.steps=2", "profile.memory=true"]  # fmt: skip
    log = train_on_cuda(straight, synthetic_data, 8, tmp_path, *profile)
    assert "bf16 on cuda" in log, log[-2000:]  # the table's heading
    out = straight / "profile" / "step_00000003-00000004"
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "rank_00000.groups.json", "rank_00000.memory.pickle", "rank_00000.trace.json", "table.txt",
    ], names  # fmt: skip
    trace = json.loads((out / "rank_00000.trace.json").read_text())
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels, "no CUDA kernel in the trace"
    groups = json.loads((out / "rank_00000.groups.json").read_text())
    assert groups["groups_ms"]["matmul"] > 0 and groups["groups_ms"]["optimizer"] > 0
    assert (out / "rank_00000.memory.pickle").stat().st_size > 0
    print((out / "table.txt").read_text())

    for stop in (4, 8):
        train_on_cuda(resumed, synthetic_data, stop, tmp_path)
    a, b = losses(straight), losses(resumed)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    assert [a[s] for s in sorted(a)] == [b[s] for s in sorted(b)], (a, b)  # bitwise


def test_two_deterministic_cuda_runs_give_bitwise_equal_losses(
    synthetic_data: Path, tmp_path: Path
) -> None:
    """CPU twin: tests/integration/test_reproducible.py (runs idle, loaded and with
    train.deterministic, bitwise). Here two runs with `train.deterministic=true` on the GPU, every
    other `auto` left to the machine: the same decisions and the same loss at every step."""
    from tests.integration.conftest import assert_same_decisions

    first, second = tmp_path / "first", tmp_path / "second"
    for run in (first, second):
        log = train_on_cuda(run, synthetic_data, 6, tmp_path, "train.deterministic=true")
        assert "attention auto -> " in log, log[-2000:]
    assert_same_decisions(second, first)
    a, b = losses(first), losses(second)
    assert sorted(a) == list(range(1, 7))
    assert [a[s] for s in sorted(a)] == [b[s] for s in sorted(b)], (a, b)  # bitwise
