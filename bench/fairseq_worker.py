"""fairseq's half of bench/peer_fairseq.py, under the python of fairseq's venv (torch and
fairseq only): `fairseq_worker.py COMMAND SPEC.json ARGS...` (SPEC: bench/peer_fairseq.py).

`export-init OUT.pt`: fairseq's own initial weights under paperscale's names and id order.
`lockstep DUMP.pt STEPS`: fairseq's model from DUMP's weights on its micro-batches (paperscale
ids) with fairseq's criterion, Adam and schedule and paperscale's sinusoidal table; one JSON
line per step: its loss and seconds.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
from torch import nn


def build(spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    """fairseq's task, model and criterion for the recipe's arguments."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    ns = options.parse_args_and_arch(parser, input_args=[spec["bin"], *spec["args"]])
    cfg = convert_namespace_to_omegaconf(ns)
    utils.set_torch_seed(spec["seed"])
    task = tasks.setup_task(cfg.task)
    return cfg, task.build_model(cfg.model), task.build_criterion(cfg.criterion)


def fairseq_name(ours: str) -> str:
    """paperscale's parameter name -> fairseq's (layers have the same indices)."""
    n = ours
    if n.startswith("encoder."):
        n = n.replace("norm1", "self_attn_layer_norm").replace("norm2", "final_layer_norm")
    else:
        n = n.replace("cross_attn", "encoder_attn").replace("norm1", "self_attn_layer_norm")
        n = n.replace("norm2", "encoder_attn_layer_norm").replace("norm3", "final_layer_norm")
    return n.replace("ffn.linear1", "fc1").replace("ffn.linear2", "fc2")


SHARED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
OUTPUT = "decoder.output_projection.weight"


def permutation(spec: dict[str, Any], vocab: int) -> torch.Tensor:
    """fairseq index of each paperscale id (the specials differ; pieces keep their ids)."""
    special = {int(k): v for k, v in spec["special"].items()}
    return torch.tensor([special.get(i, i) for i in range(vocab)])


def to_fairseq(ours: dict[str, torch.Tensor], perm: torch.Tensor) -> dict[str, torch.Tensor]:
    """paperscale's weights under fairseq's names, the shared embedding in its order."""
    embed = torch.empty_like(ours["embed.weight"])
    embed[perm] = ours["embed.weight"]  # (V, D) rows in fairseq's dictionary order
    out = {fairseq_name(k): v for k, v in ours.items() if k != "embed.weight"}
    return out | dict.fromkeys((*SHARED, OUTPUT), embed)


def to_ours(
    fs: dict[str, torch.Tensor], names: list[str], perm: torch.Tensor
) -> dict[str, torch.Tensor]:
    """fairseq's weights under paperscale's `names`, the embedding in paperscale's id order."""
    return {
        k: (fs[SHARED[0]][perm] if k == "embed.weight" else fs[fairseq_name(k)]).clone()
        for k in names
    }  # the embedding: (V, D) rows in paperscale id order


class Positions(nn.Module):
    """paperscale's sinusoidal table (interleaved sin/cos, positions from 0) for fairseq."""

    def __init__(self, d_model: int, n: int = 1024) -> None:
        super().__init__()
        pos = torch.arange(n, dtype=torch.float64)[:, None]  # (N, 1)
        two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
        angle = pos / torch.pow(10000.0, two_i / d_model)  # (N, D/2)
        table = torch.empty(n, d_model, dtype=torch.float64)  # (N, D)
        table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
        self.register_buffer("table", table.float())
        self.max_positions = n

    def forward(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        b, t = tokens.shape
        return self.table[:t][None].expand(b, -1, -1)  # (B, T, D)


def export_init(spec: dict[str, Any], out: str) -> None:
    """fairseq's own initial weights, saved to `out` in paperscale's terms."""
    _, model, _ = build(spec)
    perm = permutation(spec, model.encoder.embed_tokens.weight.shape[0])
    torch.save(to_ours(model.state_dict(), spec["names"], perm), out)


def lockstep(spec: dict[str, Any], dump_path: str, steps: str) -> None:
    """`steps` updates of fairseq's model from the dump's weights on its micro-batches."""
    from fairseq import optim
    from fairseq.optim import lr_scheduler

    cfg, model, criterion = build(spec)
    dump = torch.load(dump_path, weights_only=True)
    vocab, d_model = dump["init"]["embed.weight"].shape  # (V, D)
    perm = permutation(spec, vocab)
    missing = model.load_state_dict(to_fairseq(dump["init"], perm), strict=False)
    assert not missing.unexpected_keys, missing.unexpected_keys
    model.encoder.embed_positions = Positions(d_model)
    model.decoder.embed_positions = Positions(d_model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = optim.build_optimizer(cfg.optimizer, params)
    sched = lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, optimizer)
    sched.step_update(0)
    model.train()
    batches, accum = dump["batches"], spec["accum"]
    for step in range(int(steps)):
        started = time.perf_counter()
        optimizer.zero_grad()
        sample_size, loss_sum = 0, 0.0
        for b in batches[accum * step : accum * (step + 1)]:
            sample = {
                "net_input": {
                    "src_tokens": perm[b["src"]],
                    "src_lengths": b["src"].ne(0).sum(1),
                    "prev_output_tokens": perm[b["tgt_in"]],
                },
                "target": perm[b["tgt_out"]],
                "ntokens": int(b["tgt_out"].ne(0).sum()),
                "nsentences": int(b["src"].shape[0]),
            }
            loss, size, log = criterion(model, sample)
            loss.backward()
            sample_size += size
            loss_sum += float(log["loss"])
        optimizer.multiply_grads(1.0 / sample_size)
        optimizer.step()
        sched.step_update(step + 1)
        seconds = time.perf_counter() - started
        line = {"step": step + 1, "loss": loss_sum / sample_size, "s": seconds}
        print(json.dumps(line), flush=True)  # whole lines: stderr shares the log


if __name__ == "__main__":
    command, spec_path, *rest = sys.argv[1:]
    with open(spec_path) as f:
        {"export-init": export_init, "lockstep": lockstep}[command](json.load(f), *rest)
