"""torch's Adam, run without importing torch._dynamo where nothing is compiled.

`torch.optim.Optimizer` imports the compiler's front end (torch._dynamo: sympy, the bytecode
tracer, FSDP's helpers) the first time one of its methods runs: `add_param_group`,
`state_dict`, `load_state_dict` and `zero_grad` are wrapped in `torch._disable_dynamo`, which
imports it to mark them as not to be traced, and `step` in `_use_grad_for_differentiable`,
which imports it for a graph break. That import is ~2.3 s of CPU, ~40 % of what a rank spends
starting, paid by every rank of every start (restarts and requeues included) of a run that
never compiles anything.

`EagerAdam` is `torch.optim.Adam` with those five methods calling the functions those wrappers
wrap: the same code, in the same order, on the same tensors (bitwise the same results:
tests/trainer/test_eager_adam.py), minus the marks only the compiler reads. `step` keeps
`_use_grad_for_differentiable`'s own work (gradient mode off unless `differentiable`), and the
step hooks and profiler label `Optimizer` adds to every subclass's `step`. Where a run
compiles (`train.compile` other than false), the engine builds `torch.optim.Adam` itself: the
compiler is imported anyway then, and its marks matter. Where this torch's methods are not
wrapped as described (another version), `adam` falls back to `torch.optim.Adam`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Adam, Optimizer

WRAPPED = ("add_param_group", "state_dict", "load_state_dict", "zero_grad")


def wrapped_function(method: Callable[..., Any]) -> Callable[..., Any]:
    """The function under `method`'s decorators (each sets `__wrapped__`, functools.wraps)."""
    while getattr(method, "__wrapped__", None) is not None:
        method = method.__wrapped__  # type: ignore[attr-defined]
    return method


@functools.cache
def plain_methods() -> dict[str, Callable[..., Any]] | None:
    """`Adam.step` and Optimizer's dynamo-marked methods as the functions they wrap; None where
    this torch does not wrap them so (each must be torch's own function of that name)."""
    out = {"step": wrapped_function(Adam.step)}
    out |= {name: wrapped_function(getattr(Optimizer, name)) for name in WRAPPED}
    for name, fn in out.items():
        code = getattr(fn, "__code__", None)
        if code is None or code.co_name != name or "torch/optim/" not in code.co_filename:
            return None
    if wrapped_function(Adam.step) is Adam.step:  # not wrapped: nothing to go around
        return None
    return out


class EagerAdam(Adam):
    """`torch.optim.Adam` whose methods never import torch._dynamo (see the module)."""

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _plain("step")(self, closure)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _plain("add_param_group")(self, param_group)

    def state_dict(self) -> dict[str, Any]:
        return _plain("state_dict")(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _plain("load_state_dict")(self, state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _plain("zero_grad")(self, set_to_none)


def _plain(name: str) -> Callable[..., Any]:
    methods = plain_methods()
    assert methods is not None  # `adam` builds EagerAdam only where they were found
    return methods[name]


def adam(params: Iterable[Any], compiled: bool, **kwargs: Any) -> Adam:
    """An Adam optimizer over `params`: `EagerAdam` where nothing is compiled and this torch
    wraps its methods as the module describes, else `torch.optim.Adam`."""
    if compiled or plain_methods() is None:
        return Adam(params, **kwargs)
    register_with_zero()
    return EagerAdam(params, **kwargs)


def register_with_zero() -> None:
    """Name EagerAdam among the optimizers ZeRO supports (it is torch's Adam): DeepSpeed checks
    the exact type and otherwise warns that an untested optimizer is in use."""
    from trainer.ds.engine import import_deepspeed

    import_deepspeed()  # (its Muon module loaded its way first)
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    if EagerAdam not in ZERO_SUPPORTED_OPTIMIZERS:
        ZERO_SUPPORTED_OPTIMIZERS.append(EagerAdam)
