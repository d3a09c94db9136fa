"""The DeepSpeed config, generated from ours (there is no hand-written JSON)."""

from __future__ import annotations

from typing import Any

from trainer.config import OptimConfig, TrainConfig


def skips_nonfinite_steps(optim: OptimConfig) -> bool:
    """Whether the train step itself leaves the weights and Adam's state unchanged in a step
    whose loss was not finite on some rank (trainer/step.py: torch's fused Adam takes a
    device-side `found_inf`, so no host read). The unfused kernel does not: there DeepSpeed's
    own check stays on."""
    return optim.fused


def norm_every_step(train: TrainConfig, optim: OptimConfig) -> bool:
    """Whether DeepSpeed computes the gradient norm in every step: where clipping needs it, and
    in fp32 with the unfused Adam, where DeepSpeed's check of the norm is the only guard against
    a non-finite step. Otherwise the loop asks for it on log steps only (`ask_grad_norm`)."""
    unguarded_fp32 = train.precision == "fp32" and not skips_nonfinite_steps(optim)
    return optim.grad_norm and (optim.clip_grad > 0 or unguarded_fp32)


def step_guards_update(train: TrainConfig, optim: OptimConfig) -> bool:
    """Whether the train step must guard the update against a non-finite loss itself: where
    DeepSpeed's own check is off on some steps (bf16 with the fused kernel; fp32 unless the
    gradient norm, whose validity DeepSpeed checks, is computed in every step). fp16's loss
    scaler skips such steps itself."""
    if not skips_nonfinite_steps(optim):
        return False
    return train.precision == "bf16" or (
        train.precision == "fp32" and not norm_every_step(train, optim)
    )


def ask_grad_norm(engine: Any, train: TrainConfig, optim: OptimConfig, logs: bool) -> None:
    """Before a step: the gradient norm where the step logs it or `norm_every_step`."""
    if optim.grad_norm and not norm_every_step(train, optim):
        compute_grad_norm_for(engine, logs)


def compute_grad_norm_for(engine: Any, on: bool) -> bool:
    """Have ZeRO 1/2 compute the gradient norm in the next step or not (its optimizer reads
    the flag in each step; without it `engine.get_global_grad_norm()` is None). Returns whether
    the choice took: ZeRO 0 and 3, and BF16_Optimizer (ZeRO 1 summing in fp32), always compute
    it."""
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None or not hasattr(optimizer, "compute_grad_norm"):
        return False
    optimizer.compute_grad_norm = on
    return True


def fp32_sums(train: TrainConfig) -> bool:
    """Whether the engine sums bf16 gradients in fp32: the run's decision, or for an engine
    built without one (benches, calibration) what `auto` decides for its config."""
    from trainer.config import sums_in_fp32

    return sums_in_fp32(train.grad_accum_dtype, train.precision, train.grad_accum, train.zero_stage)


def build_ds_config(
    train: TrainConfig, optim: OptimConfig, world_size: int, load_universal: bool = False
) -> dict[str, Any]:
    """Engine settings: ZeRO stage, precision, accumulation and clipping.

    Micro-batches are sized in tokens, not samples, so `train_micro_batch_size_per_gpu` is a
    nominal 1; the loss is normalised by the step's real token count in the train step.
    """
    zero: dict[str, Any] = {
        "stage": train.zero_stage,
        "reduce_bucket_size": train.bucket_elements,
        "allgather_bucket_size": train.bucket_elements,
        "overlap_comm": train.overlap_comm,
        "contiguous_gradients": True,
    }
    if train.zero_stage == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": train.bucket_elements,
                "stage3_param_persistence_threshold": 100_000,
                "stage3_gather_16bit_weights_on_model_save": False,
            }
        )
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": train.grad_accum,
        "train_batch_size": train.grad_accum * world_size,
        "gradient_clipping": optim.clip_grad,
        "zero_optimization": zero,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }
    # DeepSpeed's throughput timer synchronises the device in every forward and step (two
    # syncs per micro-batch on a GPU); the trainer measures its own throughput without one.
    config["timers"] = {"throughput": {"enabled": False, "synchronized": False}}
    summed_fp32 = fp32_sums(train)
    if summed_fp32:  # ZeRO 1: DeepSpeed's BF16_Optimizer (fp32 gradients); 2, 3: fp32 partitions
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    # no norm kernels (nor, in fp32, the check of the norm on the host); BF16_Optimizer always
    # computes it (DeepSpeed refuses it off there)
    if not optim.grad_norm and not (summed_fp32 and train.zero_stage == 1):
        zero["compute_grad_norm"] = False
    if load_universal:  # resuming a checkpoint saved on another number of ranks
        config["checkpoint"] = {"load_universal": True}
    if train.precision == "bf16":
        # Its per-step overflow check costs a norm per gradient, a collective and a host read;
        # where the train step guards the update itself (skips_nonfinite_steps) it is off.
        config["bf16"] = {"enabled": True, "check_grad_overflow": not skips_nonfinite_steps(optim)}
    elif train.precision == "fp16":
        config["fp16"] = {
            "enabled": True,
            "loss_scale": 0,  # dynamic
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    return config
