"""Metrics sinks: failure handling, console, jsonl, TensorBoard, wandb construction, secrets."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import torch

from trainer.metrics import (
    MetricsLogger,
    Throughput,
    memory_metrics,
)
from trainer.secrets import is_secret_name, scrub_secrets
from trainer.sinks import (
    ConsoleSink,
    JsonlSink,
    TensorBoardSink,
    WandbSink,
    open_sink,
)


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


# --- secrets -------------------------------------------------------------------------------


def test_secret_names_match_words_not_ordinary_settings() -> None:
    for name in ("WANDB_API_KEY", "MY_SECRET_TOKEN", "password", "db.passwd", "hf_token", "apikey"):
        assert is_secret_name(name), name
    for name in ("max_tokens", "keep_last", "n_tgt_tokens", "monkey", "bucket_width"):
        assert not is_secret_name(name), name


def test_scrub_secrets_drops_secret_keys_and_env_derived_values() -> None:
    env = {"MY_SECRET_TOKEN": "canary2-value", "HOME": "/root"}
    config = {
        "data": {"max_tokens": 512, "dir": "/data"},
        "logging": {"api_key": "abc", "note": "from env: canary2-value"},
        "tags": ["ok", "canary2-value"],
        "home": "/root",
    }
    clean = scrub_secrets(config, env)
    assert clean == {
        "data": {"max_tokens": 512, "dir": "/data"},
        "logging": {},
        "tags": ["ok"],
        "home": "/root",
    }
    assert config["logging"]["api_key"] == "abc"  # the input is not modified


# --- sinks ---------------------------------------------------------------------------------


def test_sink_that_fails_to_open_is_reported_once() -> None:
    warnings: list[str] = []

    def broken() -> JsonlSink:
        raise PermissionError("read-only file system")

    assert open_sink("tensorboard", broken, warn=warnings.append) is None
    assert warnings == [
        "warning: metrics sink 'tensorboard' failed and is switched off: read-only file system"
    ]


def test_wandb_dir_that_is_a_file_fails_at_construction(tmp_path: Path) -> None:
    (tmp_path / "wandb").write_text("not a directory")
    warnings: list[str] = []
    sink = open_sink(
        "wandb",
        lambda: WandbSink(tmp_path, "offline", "p", "n", "abc123", {}),
        warn=warnings.append,
    )
    assert sink is None
    assert len(warnings) == 1 and "'wandb'" in warnings[0]


def test_console_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    sink = ConsoleSink(out, total_steps=10)
    sink.write(3, {"loss": 2.5, "lr": 1e-4, "samples_skipped_long": 0})
    sink.close()
    assert out.getvalue() == "step 3 loss=2.5000 lr=1.000e-04 samples_skipped_long=0\n"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_console_progress_bar_with_eta_on_a_terminal() -> None:
    out = FakeTerminal()
    sink = ConsoleSink(out, total_steps=10, start_step=2)
    sink.write(4, {"loss": 2.5, "tokens_per_s": 1000.0})
    sink.write(6, {"loss": 2.0, "valid_loss": 1.9})
    sink.close()
    text = out.getvalue()
    assert "6/10" in text and "<" in text  # tqdm's "elapsed<remaining"
    assert "loss=2.0000" in text
    assert "step 6 loss=2.0000 valid_loss=1.9000" in text  # eval records stay as lines
    assert "step 4 " not in text


def test_console_bar_takes_a_budgets_horizon_as_its_total() -> None:
    out = FakeTerminal()
    sink = ConsoleSink(out, total_steps=1_000_000)
    sink.write(23, {"valid_loss": 7.9, "horizon": 1073.0})
    sink.write(40, {"loss": 7.6})
    sink.close()
    assert "40/1073" in out.getvalue()


def test_tensorboard_values_read_back_and_resume_purges(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    for step in (1, 2, 3):
        sink.write(step, {"loss": 1.0 / step, "valid_loss": 2.0, "mem_rss_gb": 0.5})
    sink.close()
    resumed = TensorBoardSink(tmp_path / "tb", resume_step=2)  # step 3 is redone
    resumed.write(3, {"loss": 0.125})
    resumed.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert {"train/loss", "valid/loss", "system/mem_rss_gb"} <= set(acc.Tags()["scalars"])
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert loss == [(1, 1.0), (2, 0.5), (3, 0.125)]


def test_throughput_leaves_paused_time_out() -> None:
    timer = Throughput()
    with timer.paused():
        time.sleep(0.05)
    assert timer.lap() < 0.05


def test_memory_metrics_on_cpu() -> None:
    mem = memory_metrics(torch.device("cpu"))
    assert set(mem) == {"mem_rss_gb"} and 0.01 < mem["mem_rss_gb"] < 1000
