"""Kernels chosen for the machine a run trains on: the attention kernel (SDPA backend).

`train.attention: auto` follows a rule measured by bench/attention.py (forward + backward of the
model's attention at its shapes, each SDPA kernel side by side; figures in bench/RESULTS.md):

- CPU, bf16: the math kernel (two matmuls and a softmax). torch's flash kernel for the CPU
  computes bf16 with a backward several times slower than math's at sentence lengths;
- CPU, fp32: flash, which is faster than math there;
- CUDA: torch's own order (flash, memory-efficient, cuDNN, math: the first that takes the call's
  dtype, shapes and mask). Measured on an H200 at the big preset's shapes (bench attention_gpu,
  bench/RESULTS.md): the fastest kernel or within 7 % of it in 17 of 18 cases (fp32 and bf16,
  the three forms, T of 24, 64 and 128), 1.22x the memory-efficient kernel's time in one (bf16,
  no mask, T=24); math is 1.5-6.1x slower than the fastest.

A name (`math`, `flash`, `efficient`, `cudnn`) restricts torch to that kernel; `default` leaves
the choice to torch on every device. The resolved name is written to the run's config, so that
a resumed run computes with the kernel it started with.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.nn.attention import SDPBackend

from model.attention import SDPA_BACKENDS


@dataclass(frozen=True)
class KernelChoice:
    """A resolved kernel name and the one-line reason for it."""

    name: str
    reason: str

    def line(self, what: str, requested: str) -> str:
        return f"{what} {requested} -> {self.name}: {self.reason}"


def resolve_attention(requested: str, device_type: str, precision: str) -> KernelChoice:
    """`train.attention` for this device and training precision."""
    if requested != "auto":
        return KernelChoice(requested, "as configured")
    if device_type == "cpu" and precision == "bf16":
        return KernelChoice(
            "math", "bf16 on a CPU, where flash's backward is slower (bench/attention.py)"
        )
    if device_type == "cpu":
        return KernelChoice("flash", f"{precision} on a CPU, where flash is the faster kernel")
    return KernelChoice("default", "torch's own choice per call on CUDA (flash first)")


def sdpa_backends(name: str) -> tuple[SDPBackend, ...] | None:
    """The SDPA kernels a resolved `train.attention` allows (None: torch's own choice)."""
    if name == "default":
        return None
    return (SDPA_BACKENDS[name],)
