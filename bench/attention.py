"""SDPA kernels side by side: forward + backward milliseconds of each kernel torch has for this
device at a preset's attention shapes (B = data.max_tokens / T for T of 24, 64 and 128; causal,
padded keys, no mask), in each precision the machine trains in, on one thread; and flash / math
per case, the figures behind trainer/kernels.py's rule for `train.attention: auto`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from bench.common import Row, row
from launch.config import load_config
from model.attention import attention, build_attn_mask
from trainer.kernels import sdpa_backends
from trainer.precision import cpu_bf16_verdict

LENGTHS = (24, 64, 128)
FORMS = ("causal", "padded keys", "no mask")


def kernels_of(device: torch.device) -> list[str]:
    """The kernels torch has for `device`; on CUDA also `default`, torch's own choice per call
    (what `train.attention: auto` resolves to there)."""
    if device.type == "cpu":
        return ["math", "flash"]
    return ["math", "flash", "efficient", "cudnn", "default"]


def case(
    b: int, h: int, t: int, dk: int, form: str, dtype: torch.dtype, device: torch.device
) -> Callable[[str], None]:
    """A closure: one forward + backward of this case with a given kernel."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, t, dk, generator=g).to(device, dtype) for _ in range(3))
    for x in (q, k, v):
        x.requires_grad_()
    grad = torch.randn(b, h, t, dk, generator=g).to(device, dtype)
    pad = torch.zeros(b, t, dtype=torch.bool, device=device)
    pad[::3, t - t // 4 :] = True  # a third of the rows padded by a quarter
    kwargs: dict = {
        "causal": {"is_causal": True},
        "padded keys": {"attn_mask": build_attn_mask(pad, t, t, causal=False)},
        "no mask": {},
    }[form]

    def run(kernel: str) -> None:
        out = attention(q, k, v, backends=sdpa_backends(kernel), **kwargs)
        out.backward(grad)

    return run


def time_ms(run: Callable[[], None], device: torch.device, repeats: int) -> float:
    """The best of `repeats` timed calls after two untimed ones."""
    best = float("inf")
    for i in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            best = min(best, time.perf_counter() - start)
    return 1000 * best


def measure(config: str = "configs/tiny.yaml", smoke: bool = False) -> list[Row]:
    """Every kernel in every case (smoke: one length of 16, two repeats)."""
    job = load_config(config, [])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(1)
    h, dk = job.model.n_heads, job.model.d_model // job.model.n_heads
    dtypes = {"fp32": torch.float32}
    if device.type == "cuda" or cpu_bf16_verdict(job.model.d_model, job.model.d_ff).use_bf16:
        dtypes["bf16"] = torch.bfloat16
    lengths, repeats = ((16,), 2) if smoke else (LENGTHS, 7)
    max_tokens = 256 if smoke else job.data.max_tokens
    rows: list[Row] = []
    for precision, dtype in dtypes.items():
        for t in lengths:
            b = max(max_tokens // t, 1)
            for form in FORMS:
                run = case(b, h, t, dk, form, dtype, device)
                ctx = {"precision": precision, "B": b, "T": t, "H": h, "Dk": dk, "form": form}
                times = {}
                for kernel in kernels_of(device):
                    try:
                        times[kernel] = time_ms(lambda k=kernel, r=run: r(k), device, repeats)
                    except RuntimeError:  # the kernel does not take this case
                        continue
                    label = f"{precision} {form} T={t}, {kernel}"
                    rows.append(row(label, times[kernel], "ms", kernel=kernel, **ctx))
                if "flash" in times and "math" in times:
                    label = f"{precision} {form} T={t}, flash / math"
                    rows.append(row(label, times["flash"] / times["math"], "x", **ctx))
    return rows
