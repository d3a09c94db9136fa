"""Engine options under the real DeepSpeed engine: activation checkpointing and torch.compile."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.integration.test_zero_stages import losses, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.parametrize("stage", [2, 3])
def test_activation_checkpointing_gives_the_same_losses(
    synthetic_data: Path, tmp_path: Path, stage: int
) -> None:
    # Dropout is on (TINY_MODEL): recomputation in backward must replay the same masks.
    plain, ckpt = tmp_path / "plain", tmp_path / "ckpt"
    train(plain, synthetic_data, stage, 4, tmp_path)
    train(ckpt, synthetic_data, stage, 4, tmp_path, "train.activation_checkpointing=true")
    assert len(losses(plain)) == 4
    assert losses(ckpt) == pytest.approx(losses(plain), rel=1e-6)


def test_torch_compile_trains_like_eager(synthetic_data: Path, tmp_path: Path) -> None:
    """`train.compile=true` (the whole model) and `layers` (each layer a region: what `auto`
    picks on a GPU) through the real engine, evaluation and export. One rank under ZeRO 2
    (each rank compiles the same graphs, a minute or more of CPU each on a CPU without
    AVX-512: a second rank would add only that)."""
    # Without dropout: compiled kernels draw their random numbers from another stream. Each
    # scope compiles one training graph per stack (batches with and without source padding
    # alike) and one for the validation's forward.
    eager = tmp_path / "eager"
    common = ("model.dropout=0.0", "train.save_every=0")
    train(eager, synthetic_data, 2, 3, tmp_path, *common, nproc=1)
    a = load_file(str(eager / "model" / "model.safetensors"))
    for scope in ("true", "layers"):
        compiled = tmp_path / f"compiled-{scope}"
        train(compiled, synthetic_data, 2, 3, tmp_path, *common, f"train.compile={scope}",
              nproc=1)  # fmt: skip
        assert len(losses(compiled)) == 3
        assert losses(compiled) == pytest.approx(losses(eager), rel=1e-4), scope
        # The compiled run's checkpoint is an ordinary one: its export holds the same names
        # and shapes (no wrapper prefix), so export, average and translate need nothing special.
        b = load_file(str(compiled / "model" / "model.safetensors"))
        assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
