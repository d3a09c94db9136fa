"""The planner's pure functions and `paperscale plan` through the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from launch.cost_model.activations import (
    loss_workspace_bytes,
    per_token_bytes,
    projection_copy_bytes,
)
from launch.cost_model.plan import (
    BATCH_TOLERANCE,
    GIB,
    Buckets,
    Machine,
    accumulation_steps,
    activation_bytes,
    ds_buckets,
    largest_micro_batch,
    make_plan,
    model_state_bytes,
    recommend_stage,
    stage_plan,
)
from model.config import LOSS_CHUNK_ELEMENTS, ModelConfig
from tests.integration.conftest import compiled_in_fresh_python
from tests.launch.conftest import plan_cli

ROOT = Path(__file__).resolve().parents[2]
NO_BUCKETS = Buckets(reduce=0, allgather=0, prefetch=0, persistence_threshold=0)
BIG = ModelConfig(vocab_size=37000, d_model=1024, n_heads=16, d_ff=4096)
BASE = ModelConfig(vocab_size=37000)


@pytest.mark.parametrize("world", [1, 2, 4, 8, 64])
def test_model_states_partition_by_stage(world: int) -> None:
    psi = 1_000_000
    states = {s: model_state_bytes(psi, s, world, "bf16", NO_BUCKETS) for s in range(4)}
    assert states[0]["resident"] == 16 * psi
    # DeepSpeed's reduction after the backward flattens the 16-bit gradients (one bucket)
    assert states[0]["buffers"] == 2 * psi
    assert states[1]["params"] == 2 * psi and states[1]["grads"] == 2 * psi
    assert states[1]["optimizer"] == pytest.approx(12 * psi / world)
    assert states[2]["params"] == 2 * psi
    assert states[2]["grads"] == pytest.approx(2 * psi / world)
    assert states[2]["optimizer"] == pytest.approx(12 * psi / world)
    assert states[3]["total"] == pytest.approx(16 * psi / world)
    totals = [states[s]["resident"] for s in range(4)]
    if world == 1:
        assert totals == [16 * psi] * 4
    else:
        assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4


def test_partitioned_terms_scale_one_over_world() -> None:
    psi = 3_000_000
    for stage, partitioned in ((1, ["optimizer"]), (2, ["optimizer", "grads"]), (3, ["total"])):
        one = model_state_bytes(psi, stage, 1, "bf16", NO_BUCKETS)
        for world in (2, 8, 32):
            many = model_state_bytes(psi, stage, world, "bf16", NO_BUCKETS)
            for key in partitioned:
                assert many[key] == pytest.approx(one[key] / world)


def test_buckets_come_from_the_train_config() -> None:
    from trainer.config import TrainConfig

    n = TrainConfig().bucket_elements
    s1 = model_state_bytes(10**6, 1, 2)
    s3 = model_state_bytes(10**6, 3, 2)
    assert s1["buffers"] == 2 * 2 * n  # two 16-bit reduce buckets in flight (overlap_comm)
    assert s1["resident"] == s1["total"] - s1["buffers"]
    assert s3["resident"] == s3["params"] + s3["grads"] + s3["optimizer"] + 2 * n
    off = ds_buckets(TrainConfig(overlap_comm=False, bucket_elements=1000))
    assert model_state_bytes(10**6, 2, 2, "bf16", off)["buffers"] == 2 * 1000  # one bucket


def test_overlap_hides_the_gradient_reduction_behind_the_backward_but_its_last_bucket() -> None:
    from launch.cost_model.step_time import exposed_sync

    on, off = Buckets(25_000_000, 0, 0, 0, True), Buckets(25_000_000, 0, 0, 0, False)
    psi, sync, compute = 200_000_000, 0.080, 0.300  # ZeRO 1: reduce 40 ms + gather 40 ms
    assert exposed_sync(sync, compute, 1, 1, psi, off) == sync
    # ZeRO 0: the all-reduce (2 units, all of it reduction) hidden but its last bucket
    assert exposed_sync(sync, compute, 0, 1, psi, on) == pytest.approx(0.080 / 8)
    assert exposed_sync(sync, compute, 3, 1, psi, on) == sync  # planned without overlap
    # the backward (200 ms) hides the reduction but its last bucket (1/8 of 40 ms)
    assert exposed_sync(sync, compute, 1, 1, psi, on) == pytest.approx(0.040 + 0.005)
    # a reduction longer than the backward shows its excess
    assert exposed_sync(1.0, compute, 1, 1, psi, on) == pytest.approx(0.5 + 0.5 - 0.2)
    # ZeRO 2, 4 micro-batches: 5 units, one reduction in each backward (50 ms each)
    assert exposed_sync(0.050 * 5, compute, 2, 4, psi, on) == pytest.approx(0.050 + 4 * 0.050 / 8)


def test_fp32_has_no_master_copy_at_stage_0() -> None:
    assert model_state_bytes(100, 0, 1, "fp32", NO_BUCKETS)["resident"] == 16 * 100
    assert model_state_bytes(100, 1, 1, "fp32", NO_BUCKETS)["total"] == 20 * 100


@pytest.mark.parametrize("world", [1, 4])
def test_bf16_summing_in_fp32_adds_its_gradient_buffers(world: int) -> None:
    """ZeRO 1: BF16_Optimizer's whole fp32 gradient buffer beside the bf16 gradients; ZeRO 2/3:
    fp32 gradient partitions; nothing at ZeRO 0 (DeepSpeed cannot) nor in fp32."""
    psi = 1_000_000
    plain = {s: model_state_bytes(psi, s, world, "bf16", NO_BUCKETS) for s in range(4)}
    fp32 = {s: model_state_bytes(psi, s, world, "bf16", NO_BUCKETS, 0, True) for s in range(4)}
    assert fp32[0] == plain[0]
    assert fp32[1]["grads"] == 6 * psi
    assert fp32[2]["grads"] == fp32[3]["grads"] == pytest.approx(4 * psi / world)
    for s in (1, 2, 3):
        more = fp32[s]["grads"] - plain[s]["grads"]
        assert fp32[s]["total"] - plain[s]["total"] == pytest.approx(more) and more > 0
    assert model_state_bytes(psi, 2, world, "fp32", NO_BUCKETS, 0, True)["grads"] == pytest.approx(
        4 * psi / world
    )


def test_the_plan_sums_in_fp32_where_its_batch_accumulates() -> None:
    """`auto` under bf16: fp32 sums (and their memory) at the stages whose chosen batch
    accumulates, not where one micro-batch makes the step; `bf16` never."""
    tight = Machine(nodes=1, gpus_per_node=1, gpu_mem_gib=12.0)
    for sums in ("auto", "bf16"):
        rows = [stage_plan(BIG, s, tight, 400_000, sums=sums) for s in range(4)]
        for r in rows:
            assert r["fits"] and int(r["grad_accum"]) > 1, r
            assert r["fp32_sums"] == (sums == "auto" and r["stage"] > 0)
    roomy = Machine(nodes=1, gpus_per_node=8, gpu_mem_gib=80.0)
    assert not any(stage_plan(BIG, s, roomy, 25_000)["fp32_sums"] for s in range(4))


def test_activations_grow_by_the_per_token_bytes_and_shrink_with_checkpointing() -> None:
    one, work = per_token_bytes(BIG), loss_workspace_bytes(BIG) + projection_copy_bytes(BIG)
    assert activation_bytes(BIG, 4096) == pytest.approx(4096 * one + work)
    # the concatenated Q/K/V (3 d^2) and cross K/V (2 d^2) weights, bf16, 6 + 6 layers
    assert projection_copy_bytes(BIG) == (3 * 6 + 5 * 6) * 1024 * 1024 * 2
    assert activation_bytes(BIG, 0) == 0
    assert activation_bytes(BIG, 4096, checkpointing=True) < 0.6 * activation_bytes(BIG, 4096)
    assert activation_bytes(BIG, 4096, "fp32") > activation_bytes(BIG, 4096)


def test_chunked_loss_has_no_vocabulary_term_per_token_and_compiled_has_two() -> None:
    """The chunked loss keeps d a per token whatever the vocabulary (its (V, d) work space is
    fixed); the compiler's fused plain loss holds the logits and their gradient, 2 a V."""
    wide = dataclasses.replace(BIG, vocab_size=2 * 37000)
    assert per_token_bytes(wide) == per_token_bytes(BIG)
    # fp32: the chunk's logits and log-probabilities; bf16: its logits and softmax, 2 bytes each
    assert loss_workspace_bytes(BIG, "fp32") >= 8 * LOSS_CHUNK_ELEMENTS + 4 * 37000 * 1024
    assert loss_workspace_bytes(BIG) >= 4 * LOSS_CHUNK_ELEMENTS + 4 * 37000 * 1024
    assert loss_workspace_bytes(BIG) < loss_workspace_bytes(BIG, "fp32")
    assert loss_workspace_bytes(BIG, compiled=True) == 0
    assert per_token_bytes(BIG, compiled=True) - per_token_bytes(BIG) == 2 * 2 * 37000 - 1024 * 2
    assert per_token_bytes(BIG, "fp32", compiled=True) - per_token_bytes(BIG, "fp32") == (
        2 * 4 * 37000 - 1024 * 4
    )
    # so at the paper's batch the chunked loss fits a larger micro-batch on the same GPU
    machine = Machine(gpus_per_node=1, gpu_mem_gib=12.0)  # neither reaches the 25k cap
    eager, compiled = make_plan(BIG, machine), make_plan(BIG, machine, compiled=True)
    assert eager["stages"][1]["max_micro_tokens"] > compiled["stages"][1]["max_micro_tokens"]


def test_a_gpu_plan_counts_the_loss_chunk_the_trainer_takes_there() -> None:
    """On a GPU the loss is one chunk of up to 1/32 of the memory (model.config.loss_chunking):
    the plan's fixed work space is that bound, the chosen micro-batch's its own logits; a
    calibrated CPU's plan keeps the CPU's 2^24-logit chunks."""
    from model.config import loss_chunking

    gpu, cpu = Machine(gpus_per_node=8, gpu_mem_gib=80.0), Machine(gpu_mem_gib=80.0, on_cpu=True)
    assert gpu.loss_chunking() == loss_chunking(80.0 * GIB)
    assert cpu.loss_chunking() == loss_chunking(None)
    bound = loss_workspace_bytes(BIG, chunking=gpu.loss_chunking())
    assert bound >= 4 * 80 * GIB / 32 / 4
    mlperf = loss_workspace_bytes(BIG, chunking=gpu.loss_chunking(), tokens=13_824)
    assert mlperf == 4 * 37000 * 1024 + 2 * 2 * 13_824 * 37000  # W grad; logits + softmax
    plan = make_plan(BIG, gpu, target_tokens=110_592)
    stage = plan["stages"][1]
    assert stage["fits"] and stage["max_micro_tokens"] >= 13_824


def test_micro_batch_search_is_monotone_in_memory() -> None:
    sizes = [largest_micro_batch(BIG, 2 * GIB, mem * GIB, multiple=256) for mem in range(2, 80, 3)]
    assert sizes == sorted(sizes)
    assert sizes[0] == 0 and sizes[-1] > 0
    assert all(s % 256 == 0 for s in sizes)
    for mem in (8, 24, 80):
        tokens = largest_micro_batch(BIG, 2 * GIB, mem * GIB)
        assert 2 * GIB + activation_bytes(BIG, tokens) <= mem * GIB
        assert 2 * GIB + activation_bytes(BIG, tokens + 256) > mem * GIB


@pytest.mark.parametrize("target", [1, 255, 25_000, 100_003])
@pytest.mark.parametrize("micro", [256, 4096, 7936])
@pytest.mark.parametrize("world", [1, 3, 8])
def test_accumulation_reaches_the_target(target: int, micro: int, world: int) -> None:
    accum = accumulation_steps(target, micro, world)
    assert accum * micro * world >= target
    assert accum == 1 or (accum - 1) * micro * world < target


@pytest.mark.parametrize("compiled", [False, True], ids=["chunked", "compiled"])
@pytest.mark.parametrize("gpu_mem", [12.0, 24.0, 80.0, 141.0])
@pytest.mark.parametrize("world", [1, 8, 16])
def test_plan_takes_the_largest_micro_batch_near_the_target_and_fits(
    gpu_mem: float, world: int, compiled: bool
) -> None:
    """Each stage's micro-batch is the largest that fits (up to one step's share per rank)
    while its step lands within the tolerance of the target; only otherwise is it shrunk to
    the smallest multiple that reaches the target, with no needless overshoot."""
    machine = Machine(nodes=world // 8 or 1, gpus_per_node=min(world, 8), gpu_mem_gib=gpu_mem)
    plan = make_plan(BIG, machine, target_tokens=25_000, compiled=compiled)
    share = math.ceil(25_000 / machine.world / 256) * 256
    for stage in plan["stages"]:
        if not stage["fits"]:
            continue
        accum, micro, fit = stage["grad_accum"], stage["micro_tokens"], stage["max_micro_tokens"]
        step = micro * accum * machine.world
        assert 0 < micro <= fit and micro % 256 == 0
        assert stage["peak"] <= machine.usable_bytes()
        largest = min(fit, share)
        if micro == largest:
            assert abs(step / 25_000 - 1) <= BATCH_TOLERANCE or (accum == 1 and step >= 25_000)
        else:
            assert step >= 25_000 and (micro - 256) * accum * machine.world < 25_000
            misses = [abs(a * largest * machine.world / 25_000 - 1) for a in (accum - 1, accum)]
            assert min(misses) > BATCH_TOLERANCE
    best = plan["recommended_stage"]
    assert best is not None
    assert abs(plan["tokens_per_step_per_side"] / 25_000 - 1) <= 0.2
    fewest = min(s["grad_accum"] for s in plan["stages"] if s["fits"])
    assert plan["grad_accum"] == fewest
    assert all(s["grad_accum"] > fewest for s in plan["stages"][:best] if s["fits"])
    assert plan["step_s"] == pytest.approx(
        plan["flops_per_step"] / (machine.world * machine.peak_flops * machine.mfu)
    )


def test_higher_stage_recommended_when_memory_is_tight() -> None:
    machine = Machine(nodes=1, gpus_per_node=8, gpu_mem_gib=5.0, headroom=0.0)
    stages = [stage_plan(BIG, s, machine, 25_000, buckets=NO_BUCKETS) for s in range(4)]
    assert stages[0]["micro_tokens"] < stages[3]["micro_tokens"]
    assert recommend_stage(stages) > 0
    assert recommend_stage([{**s, "fits": False} for s in stages]) is None


def test_cli_json_and_table() -> None:
    args = ["--config", "configs/big.yaml", "--nodes", "1", "--gpus-per-node", "8"]
    proc = plan_cli(*args, "--gpu-mem", "80", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["params"]["total"] == 214_245_376
    assert [s["stage"] for s in plan["stages"]] == [0, 1, 2, 3]
    assert plan["world"] == 8 and plan["target_tokens_per_side"] == 4_096 * 8  # the config's
    assert plan["micro_tokens"] * plan["grad_accum"] * 8 >= 4_096 * 8
    assert plan["max_steps"] == 300_000
    proc = plan_cli(*args, "--gpu-mem", "80", "train.activation_checkpointing=true")
    assert proc.returncode == 0, proc.stderr
    assert "recommended      ZeRO" in proc.stdout and "ZeRO 3" in proc.stdout


@pytest.mark.parametrize(
    ("gpu", "precision", "peak", "memory"),
    [("v100", "fp16", 125.0, 32.0), ("t4", "fp16", 65.0, 16.0), ("h200", "bf16", 989.0, 141.0)],
)
def test_cli_gpu_picks_the_precision_auto_would(
    gpu: str, precision: str, peak: float, memory: float
) -> None:
    proc = plan_cli("--config", "configs/big.yaml", "--gpu", gpu, "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["precision"] == precision and plan["precision_from"].startswith("auto: ")
    assert plan["peak_tflops"] == pytest.approx(peak) and plan["gpu_mem_gib"] == memory
    proc = plan_cli("--config", "configs/big.yaml", "--gpu", gpu, "--gpu-mem", "20")
    assert proc.returncode == 0 and f"precision        {precision} (auto: " in proc.stdout


def test_cli_without_gpu_states_its_assumption() -> None:
    proc = plan_cli("--config", "configs/big.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "precision        bf16 (auto, assumed: a GPU of compute capability >= 8.0" in (
        proc.stdout
    )
    proc = plan_cli("--config", "configs/big.yaml", "train.precision=fp32", "--json")
    plan = json.loads(proc.stdout)
    assert plan["precision"] == "fp32" and plan["precision_from"] == "set in the config"
    assert plan["peak_tflops"] == pytest.approx(790.0)


def test_checkpoint_bytes_match_what_deepspeed_writes() -> None:
    """14.0 bytes per parameter measured for bf16 ZeRO 2 (2 + 12); rank 0's node writes the
    module's weights and its ranks' optimizer partitions."""
    from launch.cost_model.save import fits_grace, save_plan

    p = 63_000_000
    z2 = save_plan(p, 2, world=8, ranks_per_node=8, precision="bf16")
    assert z2.total_bytes == 14 * p and z2.node_bytes == 14 * p  # one node writes it all
    two_nodes = save_plan(p, 2, world=16, ranks_per_node=8, precision="bf16")
    assert two_nodes.node_bytes == 2 * p + 12 * p / 2
    z3 = save_plan(p, 3, world=16, ranks_per_node=8, precision="bf16")
    assert z3.node_bytes == 14 * p / 2
    assert save_plan(p, 0, 8, 8, "fp32").total_bytes == 12 * p  # fp32 at stage 0: no masters
    assert z2.seconds == pytest.approx(14 * p / 1e9)
    assert fits_grace(1.0, 30.0) and not fits_grace(26.0, 30.0)


def test_cli_states_the_save_time_and_warns_when_it_does_not_fit() -> None:
    proc = plan_cli("--config", "configs/big.yaml", "--gpu", "h200", "--json")
    ckpt = json.loads(proc.stdout)["checkpoint"]
    assert ckpt["bytes_per_param"] == pytest.approx(14.0) and ckpt["fits_grace"]
    assert ckpt["write_gbs"] == 1.0 and ckpt["grace_s"] == 30.0
    slow = plan_cli("--config", "configs/big.yaml", "--gpu", "h200", "--write-gbs", "0.05")
    assert slow.returncode == 0, slow.stderr
    assert "checkpoint       3.00 GB" in slow.stdout and "at 0.05 GB/s per node" in slow.stdout
    assert "warning: a save of ~60 s does not fit train.stop_grace_s=30 s" in slow.stdout


@pytest.mark.parametrize(
    "bad, needle",
    [
        (["--gpu", "abacus"], "--gpu"),
        (["--write-gbs", "0"], "--write-gbs"),
        (["--gpu-mem", "0"], "--gpu-mem"),
        (["--nodes", "0"], "--nodes"),
        (["--mfu", "1.5"], "--mfu"),
        (["--target-tokens", "-3"], "--target-tokens"),
        (["train.zero_stage=7"], "train.zero_stage"),
    ],
)
def test_cli_bad_args_exit_2_one_line(bad: list[str], needle: str) -> None:
    proc = plan_cli("--config", "configs/base.yaml", *bad)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


@pytest.mark.parametrize(
    "d, f, heads, vocab, layers, compiled",
    [
        (64, 256, 2, 2000, 2, False),
        (128, 512, 4, 800, 1, False),
        pytest.param(64, 256, 2, 2000, 2, True, marks=pytest.mark.timeout(600)),
    ],
    ids=["chunked-2-layers", "chunked-1-layer", "compiled"],
)
def test_activation_estimate_matches_what_autograd_saves(
    d: int, f: int, heads: int, vocab: int, layers: int, compiled: bool
) -> None:
    """Bytes autograd saves in the model's bf16 training forward (the loss included) equal the
    plan's per-token bytes with, for the chunked loss, its saved (V, d) projection gradient,
    and for the compiled loss (inductor fuses the plain one) less the logits' gradient, which
    exists only in backward.

    The compiled case runs in a fresh interpreter, so that a crash of compiled code fails this
    test and not the pytest worker."""
    shape = (d, f, heads, vocab, layers)
    if compiled:
        call = f"tests.launch.test_plan:saved_and_predicted(*{shape!r}, compiled=True)"
        measured, predicted = compiled_in_fresh_python(call)  # type: ignore[misc]
    else:
        measured, predicted = saved_and_predicted(*shape, compiled=False)
    assert measured == pytest.approx(predicted, rel=0.03)


def saved_and_predicted(
    d: int, f: int, heads: int, vocab: int, layers: int, compiled: bool
) -> tuple[int, float]:
    """(bytes autograd saves in one bf16 training forward, the plan's prediction of them)."""
    import torch

    from model.transformer import Transformer
    from trainer import inductor_cache_for_this_cpu_capability

    cfg = ModelConfig(
        vocab_size=vocab, d_model=d, d_ff=f, n_heads=heads, encoder_layers=layers,
        decoder_layers=layers, dropout=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg).to(torch.bfloat16).train()
    inductor_cache_for_this_cpu_capability()
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    b, s = 8, 32
    src = torch.randint(4, vocab, (b, s))  # (B, S)
    tgt = torch.randint(4, vocab, (b, s + 1))  # (B, T + 1)
    forward = torch.compile(model, dynamic=False) if compiled else model
    if compiled:
        forward(src, tgt[:, :-1], tgt[:, 1:], 0.1, False)  # compiled outside the count
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _, _ = forward(src, tgt[:, :-1], tgt[:, 1:], 0.1, False)
    assert loss.requires_grad
    tokens = b * s
    if compiled:
        predicted = tokens * (per_token_bytes(cfg, compiled=True) - 2 * vocab)
    else:
        predicted = tokens * per_token_bytes(cfg) + 2 * vocab * d
    predicted += projection_copy_bytes(cfg)
    return sum(saved.values()), float(predicted)


def test_plan_answers_without_importing_torch() -> None:
    """`plan` is arithmetic over the config: it never imports torch (2-3 s of a CPU's time at
    every call), whatever the config asks (bf16 with accumulated, fp32-summed gradients)."""
    code = (
        "import sys\n"
        "from launch.cli import main\n"
        "sys.argv = ['paperscale', 'plan', '--config', 'configs/big_8gpu.yaml', '--gpu', 'h100',"
        " '--json', 'train.precision=bf16', 'train.grad_accum=4', 'train.zero_stage=1']\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert "torch imported: False" in proc.stderr, proc.stderr[-2000:]
    configured = json.loads(proc.stdout)["configured"]
    assert configured["grad_accum"] == 4 and configured["fp32_sums"] is True
