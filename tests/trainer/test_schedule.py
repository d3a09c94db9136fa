import pytest
import torch

from trainer.schedule import build_scheduler, inverse_sqrt_lr, linear_decay_lr, peak_lr


@pytest.mark.parametrize(("step", "expected"), [(1000, 1.75e-4), (4000, 6.99e-4), (16000, 3.49e-4)])
def test_paper_schedule_worked_examples(step: int, expected: float) -> None:
    # The seed notes' worked example: d_model 512, 4000 warm-up steps.
    lr = inverse_sqrt_lr(step, d_model=512, warmup_steps=4000)
    assert lr == pytest.approx(expected, rel=5e-3)


def test_paper_formula_equals_min_form() -> None:
    for step in (1, 10, 3999, 4000, 4001, 10**5):
        paper = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert inverse_sqrt_lr(step, d_model=512, warmup_steps=4000) == pytest.approx(paper)


def test_decay_halves_when_steps_quadruple() -> None:
    a = inverse_sqrt_lr(16000, d_model=512, warmup_steps=4000)
    assert a == pytest.approx(peak_lr(512, 4000) / 2)


def test_fairseq_variant_peak_and_warmup_init() -> None:
    lr = lambda s: inverse_sqrt_lr(  # noqa: E731
        s, d_model=512, warmup_steps=4000, lr=1e-3, warmup_init_lr=1e-7
    )
    assert lr(4000) == pytest.approx(1e-3)
    assert lr(1) == pytest.approx(1e-7 + (1e-3 - 1e-7) / 4000)
    assert lr(16000) == pytest.approx(5e-4)


def test_scheduler_first_update_uses_step_one() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=123.0)
    sched = build_scheduler(opt, d_model=512, warmup_steps=4000, lr=None, warmup_init_lr=0.0)
    seen = []
    for _ in range(3):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [inverse_sqrt_lr(k, d_model=512, warmup_steps=4000) for k in (1, 2, 3)]
    assert seen == pytest.approx(expected)


def test_linear_schedule_warms_up_then_decays_to_zero_after_the_last_step() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=123.0)
    sched = build_scheduler(opt, d_model=512, warmup_steps=4, lr=1e-3, warmup_init_lr=0.0,
                            schedule="linear", total_steps=10)  # fmt: skip
    seen = []
    for _ in range(11):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warm-up 1..4 (peak at 4), then (11 - k) / 7 of the peak: step 10 still moves, 11 does not
    assert seen[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert seen[4:] == pytest.approx([1e-3 * (11 - k) / 7 for k in range(5, 12)])
    assert seen[9] > 0 and seen[10] == 0.0
    assert linear_decay_lr(4, peak=1.0, warmup_steps=4, total_steps=4) == 1.0


def test_linear_schedule_refuses_a_warm_up_past_the_end() -> None:
    from launch.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"optim\.warmup_steps.*train\.max_steps=10"):
        load_config(None, ["optim.schedule=linear", "train.max_steps=10", "optim.warmup_steps=20"])
    with pytest.raises(ConfigError, match=r"optim\.schedule: must be one of inverse_sqrt, linear"):
        load_config(None, ["optim.schedule=cosine"])
