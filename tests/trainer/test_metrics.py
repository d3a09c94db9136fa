import json
from pathlib import Path

from trainer.metrics import JsonlSink, MetricsLogger


class Exploding:
    name = "exploding"

    def __init__(self) -> None:
        self.calls = 0

    def write(self, step: int, values: dict[str, float]) -> None:
        self.calls += 1
        raise OSError("disk says no")

    def close(self) -> None:
        pass


def test_failing_sink_is_reported_once_and_dropped(tmp_path: Path) -> None:
    warnings: list[str] = []
    bad = Exploding()
    good = JsonlSink(tmp_path / "m.jsonl")
    logger = MetricsLogger([bad, good], warn=warnings.append)
    for step in range(1, 4):
        logger.log(step, {"loss": 1.0 / step})
    logger.close()
    assert bad.calls == 1
    assert len(warnings) == 1 and "exploding" in warnings[0] and "disk says no" in warnings[0]
    steps = [json.loads(x)["step"] for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_jsonl_resume_cuts_steps_after_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    sink = JsonlSink(path)
    for step in (10, 20, 30):
        sink.write(step, {"loss": 1.0})
    sink.close()
    resumed = JsonlSink(path, resume_step=20)
    resumed.write(30, {"loss": 0.5})
    resumed.close()
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20, 30]
    assert records[-1]["loss"] == 0.5


def test_non_finite_values_become_null(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "m.jsonl")
    sink.write(1, {"loss": float("nan")})
    sink.close()
    assert json.loads((tmp_path / "m.jsonl").read_text())["loss"] is None
