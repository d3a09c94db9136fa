"""Settings of the optimiser, the training loop, checkpoints and metrics sinks."""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("inverse_sqrt", "linear")  # trainer/schedule.py


COMPILE_SCOPES = ("false", "layers", "model", "auto")  # train.compile; `true` is `model`


def compile_scope(value: object) -> str:
    """`train.compile` as one of COMPILE_SCOPES when it is one: YAML's true / false (which a
    text field holds as "True" / "False") read as model / false, as before layers existed."""
    text = str(value).strip().lower()
    return {"true": "model"}.get(text, text)


COMPILE_TIMEOUT_S = 3600.0  # the watchdog's least timeout while a run compiles


def watchdog_timeout_s(train: TrainConfig) -> float:
    """How long a phase of the loop may take before the watchdog ends the process:
    train.dist_timeout_s, and at least COMPILE_TIMEOUT_S where the run compiles anything (its
    first steps compile)."""
    compiles = compile_scope(train.compile) not in ("false", "auto")
    return max(float(train.dist_timeout_s), COMPILE_TIMEOUT_S if compiles else 0.0)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _non_negative_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass
class OptimConfig:
    """Adam and the inverse-square-root schedule.

    The paper's schedule is lr(step) = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), i.e. an
    inverse-sqrt curve whose peak at `warmup_steps` is d_model^-0.5 * warmup^-0.5. `lr` null keeps
    that peak; a number sets the peak (fairseq's large-batch recipe: lr 1e-3), and
    `warmup_init_lr` is where the linear warm-up starts (paper 0; fairseq 1e-7).
    """

    lr: float | None = None  # peak learning rate; null: the paper's d_model^-0.5 * warmup^-0.5
    warmup_steps: int = 4000  # steps of linear warm-up to the peak
    # inverse_sqrt (the paper's) or linear: warm-up, then linear decay to zero at
    # train.max_steps (trainer/schedule.py)
    schedule: str = "inverse_sqrt"
    warmup_init_lr: float = 0.0  # learning rate the warm-up starts from
    beta1: float = 0.9  # Adam's beta_1
    beta2: float = 0.98  # Adam's beta_2 (the paper's 0.98)
    eps: float = 1e-9  # Adam's epsilon (the paper's 1e-9)
    weight_decay: float = 0.0  # Adam's L2 weight decay (the paper: none)
    clip_grad: float = 0.0  # 0 = no clipping (the paper)
    fused: bool = True  # torch's fused Adam kernel (CUDA and CPU); false: its per-tensor loop
    # The gradient norm (logged as grad_norm): computed on the steps that log (train.log_every)
    # and on every step where clip_grad > 0 (or fp32's unfused Adam) needs it; false: never (no
    # norm kernels, no collective, none of the device syncs DeepSpeed's norm makes: 2 on CUDA).
    grad_norm: bool = True

    def problems(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.lr is not None and (not isinstance(self.lr, (int, float)) or not self.lr > 0):
            out.append(("lr", f"must be > 0 or null (the paper's schedule), got {self.lr!r}"))
        if not _positive_int(self.warmup_steps):
            out.append(("warmup_steps", f"must be a positive integer, got {self.warmup_steps!r}"))
        if self.schedule not in SCHEDULES:
            out.append(
                ("schedule", f"must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
            )
        if not self.warmup_init_lr >= 0:
            out.append(("warmup_init_lr", f"must be >= 0, got {self.warmup_init_lr!r}"))
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                out.append((key, f"must be in [0, 1), got {getattr(self, key)!r}"))
        if not self.eps > 0:
            out.append(("eps", f"must be > 0, got {self.eps!r}"))
        if not self.weight_decay >= 0:
            out.append(("weight_decay", f"must be >= 0, got {self.weight_decay!r}"))
        if not self.clip_grad >= 0:
            out.append(("clip_grad", f"must be >= 0 (0 = off), got {self.clip_grad!r}"))
        elif self.clip_grad > 0 and not self.grad_norm:
            out.append(("grad_norm", "must be true when clip_grad > 0 (clipping needs the norm)"))
        return out


ATTENTION_NAMES = ("auto", "default", "math", "flash", "efficient", "cudnn")  # trainer/kernels.py
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def accumulation_problem(dtype: str, precision: str, zero_stage: int) -> str:
    """Why gradients cannot be accumulated in `dtype` under `precision` ('' when they can)."""
    if dtype == "fp32" and precision == "bf16" and zero_stage == 0:
        return "fp32 under bf16 needs train.zero_stage >= 1 (DeepSpeed sums in bf16 without ZeRO)"
    if dtype in ("bf16", "fp16") and dtype != precision:
        return f"{dtype} needs train.precision={dtype}, not {precision}"
    if dtype == "fp32" and precision == "fp16":
        return "fp16 training sums gradients under its loss scaler in fp16: set fp16 or auto"
    return ""


def accumulation_choice(precision: str, grad_accum: int, zero_stage: int) -> tuple[str, str]:
    """`train.grad_accum_dtype: auto`: fp32 under bf16 where a step sums several micro-batches'
    gradients and DeepSpeed can (ZeRO 1-3); otherwise the precision's own dtype."""
    if precision != "bf16":
        return precision, f"{precision} training sums its gradients in {precision}"
    if grad_accum < 2:
        return "bf16", "one micro-batch per step (train.grad_accum=1): nothing is summed"
    if zero_stage == 0:
        return "bf16", "ZeRO 0, where DeepSpeed sums gradients in the model's dtype"
    return "fp32", f"{grad_accum} micro-batches per step summed in fp32, not in bf16's 8 bits"


def sums_in_fp32(requested: str, precision: str, grad_accum: int, zero_stage: int) -> bool:
    """Whether DeepSpeed sums the gradients in fp32 under bf16 for train.grad_accum_dtype
    `requested` (`auto`: accumulation_choice's rule); the one place the engine's config, the
    plan and the benches read it from."""
    dtype = requested
    if requested == "auto":
        dtype = accumulation_choice(precision, grad_accum, zero_stage)[0]
    return dtype == "fp32" and precision == "bf16" and zero_stage > 0


@dataclass
class TrainConfig:
    """The loop: how long, how often to evaluate, log and save, and the DeepSpeed engine's mode."""

    max_steps: int = 100_000  # optimizer steps of the run (the paper's base: 100k)
    # wall-clock minutes for the whole run (steps, evaluations, saves; trainer/budget.py): the
    # step time measured early fixes the last step, where the linear schedule reaches zero;
    # 0 = off (max_steps ends the run; with a budget it is an upper bound)
    budget_minutes: float = 0.0
    budget_calibration_steps: int = 20  # steps timed to fix a budget's horizon, at least
    # share of the budget spent before its horizon is fixed; the step time is measured over
    # its second half (the first seconds of a run can be faster than the rest); 0: at once
    budget_calibration_fraction: float = 0.1
    grad_accum: int = 1  # micro-batches per optimizer step on each rank
    zero_stage: int = 2  # DeepSpeed ZeRO: 0 none, 1 optimizer states, 2 + gradients, 3 + weights
    # auto (the machine's fastest: trainer/precision.py) | bf16 | fp16 (GPU only) | fp32
    precision: str = "auto"
    seed: int = 1  # initialisation, dropout and every other random stream of the run
    # torch's deterministic algorithms (and cuBLAS's fixed workspace on CUDA): two runs of one
    # config give bitwise-equal losses on GPUs too, at a cost (bench/RESULTS.md, gpu); the CPU
    # path is deterministic without it (trainer/autos.py)
    deterministic: bool = False
    log_every: int = 100  # steps between metric lines (console, metrics.jsonl, sinks)
    eval_every: int = 1000  # validation loss; 0 = only at the end
    eval_max_batches: int = 0  # 0 = the whole validation split
    bleu_every: int = 0  # BLEU by greedy decoding on a validation subset; 0 = only at the end
    bleu_samples: int = 200  # validation sentences the in-training BLEU decodes
    bleu_beam: int = 4  # beam size of the in-training BLEU (1 = greedy)
    # stop at the first evaluation whose valid BLEU (on the whole validation split, every
    # bleu_every steps) is >= this; saves, records time_to_target_s (trainer/target.py). 0 = off
    target_bleu: float = 0.0
    target_nll: float = 0.0  # the same for the valid NLL per target token (<=; eval_every)
    save_every: int = 0  # steps; 0 = only at the end
    save_every_minutes: float = 0.0  # wall-clock minutes on rank 0; 0 = off
    keep_last: int = 5  # checkpoints kept; older ones are deleted after each save
    # Saves before the last one copy the state to host memory and write it in the background
    # (trainer/checkpoint/background.py): the loop waits for the copy only; published when written.
    async_save: bool = False
    device: str = "auto"  # auto | cpu | cuda
    activation_checkpointing: bool = False  # recompute each layer in backward to save memory
    # seconds a collective may wait for the other ranks, and a train step, evaluation or save
    # may take on one rank, before the process exits non-zero (a dead or hung rank)
    dist_timeout_s: float = 600.0
    max_nonfinite: int = 5  # consecutive steps with a NaN/inf loss that stop the run (exit 65)
    # restarts in place of the worker group after a rank fails (torchrun --max-restarts), each
    # resuming from the latest complete checkpoint
    max_restarts: int = 3
    # attempts in a row that resume from the same checkpoint and fail before the next one:
    # then the next attempt stops (exit 70) instead of failing the same way again
    crash_loop_attempts: int = 3
    # seconds from a stop signal (TERM, USR1, Ctrl-C) to the exit after saving, planned for:
    # Slurm sends SIGKILL KillWait (default 30) after TERM; a step that would end too late to
    # save in time is abandoned (trainer/signals.py)
    stop_grace_s: float = 30.0
    # SDPA kernel: auto (trainer/kernels.py's rule for the device and precision) | default
    # (torch's choice per call) | math | flash | efficient | cudnn
    attention: str = "auto"
    # torch.compile: false | layers (each encoder and decoder layer as a region: one graph that
    # every layer reuses, the loss eager) | model (the whole forward through DeepSpeed's
    # engine.compile, the loss fused by the compiler; `true` says the same) | auto
    # (trainer/autos.py: layers on a GPU, false on a CPU)
    compile: str = "auto"
    compile_mode: str = "default"  # one of COMPILE_MODES (torch.compile's `mode`)
    # the dtype gradients are summed in over a step's micro-batches: auto (trainer/autos.py:
    # fp32 under bf16 where grad_accum > 1 at ZeRO 1-3, else the precision's) | fp32 | bf16 |
    # fp16; fp32 under bf16 is DeepSpeed's data_types.grad_accum_dtype (ZeRO 1-3 only)
    grad_accum_dtype: str = "auto"
    # each bucket of gradients reduced while the backward still computes the next: ZeRO 1-3
    # DeepSpeed's overlap_comm (two buckets in flight), ZeRO 0 all-reduced as torch's DDP does
    # (trainer/ds/overlap.py); false: reduced after the backward
    overlap_comm: bool = True
    # elements per DeepSpeed reduce / all-gather / ZeRO 3 prefetch bucket: small enough that
    # the first is full early in the backward, large enough to keep each collective efficient
    bucket_elements: int = 50_000_000

    def problems(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for key in (
            "max_steps", "grad_accum", "log_every", "bleu_samples", "bleu_beam", "keep_last",
            "crash_loop_attempts", "budget_calibration_steps", "bucket_elements",
        ):  # fmt: skip
            if not _positive_int(getattr(self, key)):
                out.append((key, f"must be a positive integer, got {getattr(self, key)!r}"))
        for key in (
            "eval_every", "eval_max_batches", "bleu_every", "save_every", "seed", "max_restarts",
        ):  # fmt: skip
            if not _non_negative_int(getattr(self, key)):
                out.append((key, f"must be a non-negative integer, got {getattr(self, key)!r}"))
        if not isinstance(self.stop_grace_s, (int, float)) or not self.stop_grace_s > 0:
            out.append(("stop_grace_s", f"must be > 0 seconds, got {self.stop_grace_s!r}"))
        if not isinstance(self.dist_timeout_s, (int, float)) or not self.dist_timeout_s > 0:
            out.append(("dist_timeout_s", f"must be > 0 seconds, got {self.dist_timeout_s!r}"))
        if not _positive_int(self.max_nonfinite):
            out.append(("max_nonfinite", f"must be a positive integer, got {self.max_nonfinite!r}"))
        out += self._target_problems()
        if not isinstance(self.budget_minutes, (int, float)) or not self.budget_minutes >= 0:
            out.append(("budget_minutes", f"must be >= 0 (0 = off), got {self.budget_minutes!r}"))
        fraction = self.budget_calibration_fraction
        if not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
            out.append(("budget_calibration_fraction", f"must be in [0, 1), got {fraction!r}"))
        if not isinstance(self.save_every_minutes, (int, float)) or self.save_every_minutes < 0:
            out.append(("save_every_minutes", f"must be >= 0, got {self.save_every_minutes!r}"))
        if self.zero_stage not in (0, 1, 2, 3):
            out.append(("zero_stage", f"must be 0, 1, 2 or 3, got {self.zero_stage!r}"))
        if self.precision not in ("auto", "bf16", "fp16", "fp32"):
            out.append(("precision", f"must be auto, bf16, fp16 or fp32, got {self.precision!r}"))
        if self.attention not in ATTENTION_NAMES:
            names = ", ".join(ATTENTION_NAMES)
            out.append(("attention", f"must be one of {names}, got {self.attention!r}"))
        if compile_scope(self.compile) not in COMPILE_SCOPES:
            scopes = ", ".join(COMPILE_SCOPES)
            out.append(("compile", f"must be one of {scopes}, got {self.compile!r}"))
        if self.compile_mode not in COMPILE_MODES:
            modes = ", ".join(COMPILE_MODES)
            out.append(("compile_mode", f"must be one of {modes}, got {self.compile_mode!r}"))
        if self.device not in ("auto", "cpu", "cuda"):
            out.append(("device", f"must be auto, cpu or cuda, got {self.device!r}"))
        if self.grad_accum_dtype not in ("auto", "fp32", "bf16", "fp16"):
            got = self.grad_accum_dtype
            out.append(("grad_accum_dtype", f"must be auto, fp32, bf16 or fp16, got {got!r}"))
        elif self.grad_accum_dtype != "auto" and self.precision != "auto":
            why = accumulation_problem(self.grad_accum_dtype, self.precision, self.zero_stage)
            out += [("grad_accum_dtype", why)] if why else []
        return out

    def _target_problems(self) -> list[tuple[str, str]]:
        """A target needs the evaluation that scores it."""
        out: list[tuple[str, str]] = []
        for key, every in (("target_bleu", "bleu_every"), ("target_nll", "eval_every")):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                out.append((key, f"must be >= 0 (0 = off), got {value!r}"))
            elif value > 0 and getattr(self, every) == 0:
                out.append((key, f"needs train.{every} > 0: the interval it is scored at"))
        return out


@dataclass
class ProfileConfig:
    """A torch.profiler trace of a few steps and the table of where their time went
    (trainer/profiler.py). Steps are counted from the start of this process."""

    enabled: bool = False  # trace the steps below of this run (docs/performance.md)
    wait_steps: int = 5  # steps first left alone (allocator, first shapes, compilation)
    warmup_steps: int = 1  # recorded and discarded: the profiler's own start-up
    steps: int = 3  # recorded
    record_shapes: bool = False  # input shapes of every op in the trace (larger files)
    with_stack: bool = False  # Python stacks of every op in the trace (much larger files)
    memory: bool = True  # CUDA: a snapshot of the allocator's history over the recorded steps

    def problems(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not _positive_int(self.steps):
            out.append(("steps", f"must be a positive integer, got {self.steps!r}"))
        for key in ("wait_steps", "warmup_steps"):
            if not _non_negative_int(getattr(self, key)):
                out.append((key, f"must be a non-negative integer, got {getattr(self, key)!r}"))
        return out


@dataclass
class LoggingConfig:
    """Where metrics go besides the console and metrics.jsonl."""

    wandb: str = "offline"  # online | offline | disabled
    wandb_project: str = "paperscale"  # the wandb project runs are logged under
    tensorboard: bool = True  # scalars into RUN/tb
    report: bool = True  # RUN/report.png when a run finishes (`paperscale report RUN` any time)

    def problems(self) -> list[tuple[str, str]]:
        if self.wandb not in ("online", "offline", "disabled"):
            return [("wandb", f"must be online, offline or disabled, got {self.wandb!r}")]
        return []
