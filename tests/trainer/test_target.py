"""The quality target's decision (trainer/target.py) in one process, and its config checks:
BLEU (scored on the whole validation split) or NLL reaching the target, the first time only,
kept in the train state a checkpoint carries; a target without the evaluation that scores it
is a config error."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from launch.config import load_config
from trainer.config import TrainConfig
from trainer.state import TrainState
from trainer.target import Target
from trainer.time_costs import WHOLE_SPLIT, bleu_samples
from trainer.validation import Evaluator

ROOT = Path(__file__).resolve().parents[2]


def target(bleu: float = 0.0, nll: float = 0.0) -> Target:
    return Target.of(TrainConfig(target_bleu=bleu, target_nll=nll, bleu_every=10), TrainState())


def test_bleu_target_is_reached_at_or_over_it_once(capsys: pytest.CaptureFixture) -> None:
    t = target(bleu=25.0)
    assert (
        t.active
        and not t.reached
        and t.summary()
        == {
            "target": "BLEU >= 25",
            "target_reached": False,
        }
    )
    assert t.check(10, {"valid_ppl": 5.0}, 1.0) == {}  # no BLEU this evaluation
    assert t.check(20, {"bleu": 24.99, "valid_ppl": 5.0}, 2.0) == {}
    assert t.check(30, {"bleu": 25.0}, 123.44) == {"time_to_target_s": 123.4}
    assert t.reached and t.state.target_step == 30
    assert "target reached at step 30: BLEU >= 25 after 123.4 s" in capsys.readouterr().out
    assert t.check(40, {"bleu": 30.0}, 200.0) == {}  # the first time counts
    assert t.summary()["time_to_target_s"] == 123.4 and t.summary()["target_step"] == 30
    restored = TrainState()
    restored.load_state_dict(t.state.state_dict())  # what a resumed run reads
    assert Target.of(TrainConfig(target_bleu=25.0), restored).reached
    assert not Target.of(TrainConfig(), restored).reached  # the target taken away: trains on


def test_nll_target_reads_the_validation_perplexity() -> None:
    t = target(nll=2.0)
    assert t.check(5, {"valid_ppl": math.exp(2.01)}, 1.0) == {}
    assert t.check(10, {"valid_ppl": math.exp(1.99)}, 2.0) == {"time_to_target_s": 2.0}
    assert t.describe() == "valid NLL <= 2"
    assert target(bleu=20.0, nll=2.0).describe() == "BLEU >= 20 or valid NLL <= 2"


def test_no_target_changes_nothing() -> None:
    t = target()
    assert not t.active and t.summary() == {} and t.check(5, {"bleu": 99.0}, 1.0) == {}
    assert bleu_samples(TrainConfig()) == 200
    assert bleu_samples(TrainConfig(target_bleu=1.0)) == WHOLE_SPLIT


def test_a_bleu_target_decodes_the_whole_validation_split() -> None:
    job = load_config(ROOT / "configs/tiny.yaml", ["train.target_bleu=20", "train.bleu_every=50"])
    assert Evaluator(None, job, None, None).bleu_samples == WHOLE_SPLIT  # type: ignore[arg-type]
    plain = load_config(ROOT / "configs/tiny.yaml")
    assert Evaluator(None, plain, None, None).bleu_samples == 200  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.target_bleu=-1"], "train.target_bleu: must be >= 0"),
        (["train.target_bleu=25", "train.bleu_every=0"], "needs train.bleu_every > 0"),
        (["train.target_nll=2", "train.eval_every=0"], "needs train.eval_every > 0"),
    ],
)
def test_a_target_without_its_evaluation_is_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(Exception, match=message):
        load_config(ROOT / "configs/tiny.yaml", overrides)
