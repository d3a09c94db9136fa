"""EagerAdam: torch's Adam to the bit, without importing the compiler (trainer/ds/adam.py)."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from tests.integration.conftest import ROOT, cli_env
from trainer.ds.adam import EagerAdam, adam, plain_methods


def trained(
    optimizer_class: type, kwargs: dict, steps: int = 6
) -> tuple[list[torch.Tensor], dict, list[torch.Tensor]]:
    """Parameters, optimizer state and per-step lr-scaled weights after `steps` steps of a
    small regression, from a fixed start (two groups, one with its own lr)."""
    torch.manual_seed(0)
    w1, w2 = torch.nn.Parameter(torch.randn(7, 5)), torch.nn.Parameter(torch.randn(5))
    x, y = torch.randn(16, 7), torch.randn(16)
    opt = optimizer_class([{"params": [w1]}, {"params": [w2], "lr": 0.03}], lr=0.01, **kwargs)
    history = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((x @ w1 @ w2 - y) ** 2).mean()
        loss.backward()
        opt.step()
        history.append(w1.detach().clone())
    return [w1.detach(), w2.detach()], opt.state_dict(), history


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"foreach": False}, {"fused": True}, {"weight_decay": 0.1, "amsgrad": True}],
    ids=["foreach", "single-tensor", "fused", "decay-amsgrad"],
)
def test_eager_adam_is_torchs_adam_to_the_bit(kwargs: dict) -> None:
    """Weights after every step and the final state (steps, moments) are bitwise torch's."""
    ours, our_state, our_history = trained(EagerAdam, kwargs)
    theirs, their_state, their_history = trained(torch.optim.Adam, kwargs)
    for a, b in zip(ours + our_history, theirs + their_history, strict=True):
        assert torch.equal(a, b)
    assert our_state["param_groups"] == their_state["param_groups"]
    for key, state in their_state["state"].items():
        for name, value in state.items():
            assert torch.equal(our_state["state"][key][name], value), name


def test_state_crosses_both_ways_and_the_step_keeps_gradient_mode() -> None:
    """A state saved by torch's Adam loads into it and goes on counting; `step` runs the step
    hooks and without gradients whatever the caller's mode (an in-place update of a parameter
    would raise under them), and restores the caller's mode."""
    _, state, _ = trained(torch.optim.Adam, {}, steps=3)
    p = torch.nn.Parameter(torch.zeros(7, 5))
    q = torch.nn.Parameter(torch.zeros(5))
    ours = EagerAdam([{"params": [p]}, {"params": [q], "lr": 0.03}], lr=0.01)
    ours.load_state_dict(copy.deepcopy(state))
    assert ours.state_dict()["param_groups"] == state["param_groups"]
    assert torch.equal(ours.state_dict()["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    p.grad, q.grad = torch.ones(7, 5), torch.ones(5)
    seen = []
    ours.register_step_pre_hook(lambda opt, args, kwargs: seen.append(torch.is_grad_enabled()))
    with torch.enable_grad():
        ours.step()
        assert torch.is_grad_enabled()
    assert seen == [True]
    assert int(ours.state_dict()["state"][0]["step"]) == 4


def test_the_engine_picks_torchs_adam_where_it_compiles() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert plain_methods() is not None  # this torch wraps them as trainer/ds/adam.py reads
    assert type(adam(params, compiled=False)) is EagerAdam
    assert type(adam(params, compiled=True)) is torch.optim.Adam
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    assert EagerAdam in ZERO_SUPPORTED_OPTIMIZERS  # no "untested optimizer" warning from ZeRO


def test_a_fresh_process_trains_with_it_and_never_imports_the_compiler() -> None:
    """The reason it exists: building, stepping, saving and loading import no torch._dynamo
    (torch.optim.Adam imports it at its first add_param_group)."""
    code = (
        "import sys, torch\n"
        "from trainer.ds.adam import adam\n"
        "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
        "opt = adam([p], compiled=False, lr=0.1, fused=True)\n"
        "opt.step(); opt.zero_grad(); opt.load_state_dict(opt.state_dict())\n"
        "print('torch._dynamo' in sys.modules)\n"
        "torch.optim.Adam([p])\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=cli_env(), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]
