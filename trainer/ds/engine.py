"""The model inside a DeepSpeed engine: seeding, the model config, the engine itself."""

from __future__ import annotations

import functools
import importlib
import os
import random
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import numpy as np
import torch

from data_pipeline.config import DataConfig
from data_pipeline.tokenizer import Tokenizer
from model.config import ModelConfig
from model.transformer import Transformer
from trainer import inductor_cache_for_this_cpu_capability
from trainer.config import LoggingConfig, OptimConfig, ProfileConfig, TrainConfig, compile_scope
from trainer.dist import DistEnv
from trainer.ds.adam import adam
from trainer.ds.config import build_ds_config
from trainer.ds.overlap import reduce_during_backward
from trainer.kernels import resolve_attention, sdpa_backends
from trainer.schedule import Horizon, build_scheduler

PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Job(Protocol):
    """What the trainer needs of a job's configuration (launch.config.JobConfig has it)."""

    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    logging: LoggingConfig
    profile: ProfileConfig


CUBLAS_WORKSPACE = ":4096:8"  # the workspace torch's deterministic cuBLAS matmuls need


def make_deterministic() -> None:
    """`train.deterministic`: torch's deterministic algorithms (an op that has none raises,
    naming itself, rather than computing differently run to run), cuBLAS's fixed workspace and
    no cuDNN autotuning. Call before the first CUDA matmul: cuBLAS reads its workspace setting
    when it makes its handle."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


# DeepSpeed's module that applies torch.compile to a function when it is imported (0.19).
MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


def compile_on_first_call(compile_now: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for torch.compile that compiles a function at its first call instead."""

    def compile_later(fn: Any = None, **kwargs: Any) -> Any:
        if fn is None:  # used as @torch.compile(...)
            return lambda f: compile_later(f, **kwargs)
        compiled: Any = None

        @functools.wraps(fn)
        def call(*args: Any, **kw: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                compiled = compile_now(fn, **kwargs)
            return compiled(*args, **kw)

        return call

    return compile_later


def import_deepspeed() -> ModuleType:
    """`import deepspeed`, with its Muon optimizer's module loaded first, lazily.

    DeepSpeed's ZeRO and bf16 optimizers import their Muon optimizer in every run, to ask
    whether the optimizer given is one, and that module applies torch.compile to a function as
    it loads: torch.compile imports inductor (~180 modules, 1.5-2.5 s of CPU in every rank at
    every start) for an optimizer the trainer never builds (it uses torch's Adam). Loaded here
    with torch.compile deferred to the function's first call, only that cost changes.
    """
    import deepspeed

    if MUON_MODULE not in sys.modules:
        compile_now = torch.compile
        torch.compile = compile_on_first_call(compile_now)  # type: ignore[assignment]
        try:
            importlib.import_module(MUON_MODULE)
        except ImportError:
            pass  # a DeepSpeed without Muon: nothing to defer
        finally:
            torch.compile = compile_now  # type: ignore[assignment]
    return deepspeed


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_model_config(model_cfg: ModelConfig, tokenizer: Tokenizer) -> ModelConfig:
    """Fill vocab_size from the tokenizer, or insist that both agree."""
    if model_cfg.vocab_size is None:
        return ModelConfig(**{**model_cfg.__dict__, "vocab_size": tokenizer.vocab_size})
    if model_cfg.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"model.vocab_size={model_cfg.vocab_size} but the data's tokenizer has "
            f"{tokenizer.vocab_size} pieces"
        )
    return model_cfg


def adam_kernel(fused: bool) -> dict[str, bool]:
    """Adam's implementation: torch's fused kernel (`optim.fused`, on CUDA and CPU alike: one
    pass over each parameter instead of a dozen, and one launch for all of them on a GPU), or
    its per-tensor loop."""
    return {"fused": True} if fused else {}


def compile_for_varying_shapes() -> dict[str, Any]:
    """torch.compile's arguments for batches whose size and lengths vary, after turning off
    duck sizing in this process.

    Dynamic from the start: one graph for training and one for evaluation (static first,
    torch.compile would compile the first shape, then again with the length dynamic, then with
    the batch size dynamic too). Duck sizing gives dimensions that are equal in the first batch
    one symbol: a first batch whose source and target lengths are equal would give a graph
    valid only for S == T and a recompilation at the first batch where they differ.
    """
    import torch.fx.experimental._config as fx_config

    inductor_cache_for_this_cpu_capability()
    fx_config.use_duck_shape = False
    return {"dynamic": True}


def build_engine(
    job: Job,
    model_cfg: ModelConfig,
    env: DistEnv,
    load_universal: bool = False,
    horizon: Horizon | None = None,
) -> Any:
    """The model inside a DeepSpeed engine with Adam and our client scheduler; `horizon` is a
    budgeted run's (fixed while it trains) for the linear schedule, else train.max_steps."""
    deepspeed = import_deepspeed()

    model = Transformer(model_cfg)
    model.set_activation_checkpointing(job.train.activation_checkpointing)
    # settle_job has resolved `auto` for a training run; a bench's own engine resolves it here
    attention = resolve_attention(job.train.attention, env.device.type, job.train.precision)
    model.set_attention_backends(sdpa_backends(attention.name))
    model.size_loss_for(env.device)
    scope = compile_scope(job.train.compile)
    optimizer = adam(
        model.parameters(),
        compiled=scope != "false",
        lr=1.0,
        betas=(job.optim.beta1, job.optim.beta2),
        eps=job.optim.eps,
        weight_decay=job.optim.weight_decay,
        **adam_kernel(job.optim.fused),
    )
    scheduler = build_scheduler(
        optimizer,
        d_model=model_cfg.d_model,
        warmup_steps=job.optim.warmup_steps,
        lr=job.optim.lr,
        warmup_init_lr=job.optim.warmup_init_lr,
        schedule=job.optim.schedule,
        total_steps=job.train.max_steps,
        horizon=horizon,
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=build_ds_config(job.train, job.optim, env.world_size, load_universal),
    )
    if job.train.zero_stage == 0 and job.train.overlap_comm and env.world_size > 1:
        reducer = reduce_during_backward(engine, job.train.bucket_elements)
        if env.rank == 0:
            print(
                f"ZeRO 0: gradients all-reduced during the backward in {len(reducer.buckets)} "
                f"bucket(s) of at most train.bucket_elements={job.train.bucket_elements}",
                flush=True,
            )
    if scope in ("model", "layers"):
        # nn.Module.compile in place: parameter names, and so checkpoints, stay the same.
        kwargs = {"mode": job.train.compile_mode, **compile_for_varying_shapes()}
        if scope == "model":
            model.source_mask_always = True  # one graph for padded and unpadded batches
            engine.compile(compile_kwargs=kwargs)
        else:
            model.compile_layers(**kwargs)
    return engine
