"""Validation during training: loss / perplexity over the split, BLEU by greedy decoding.

Both are sharded across ranks and reduced, so every rank runs the same number of collectives.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sacrebleu
import torch
import torch.distributed as dist

from data_pipeline.config import DataConfig
from data_pipeline.loader import TokenBatchStream
from data_pipeline.tokenizer import Tokenizer
from model.config import PAD_ID
from model.search import beam_search, greedy_search
from model.transformer import Transformer
from trainer.dist import DistEnv
from trainer.state import rng_preserved
from trainer.time_costs import bleu_samples


def _lockstep(batches: Iterator[Any], device: torch.device) -> Iterator[Any | None]:
    """Yield local batches while any rank still has one (None once this rank is out), so ranks
    with fewer batches keep taking part in collectives (ZeRO-3 gathers parameters in forward)."""
    while True:
        batch = next(batches, None)
        flag = torch.tensor([0.0 if batch is None else 1.0], device=device)
        dist.all_reduce(flag)
        if flag.item() == 0:
            return
        yield batch


def valid_stream(data_dir: Path, data_cfg: DataConfig, env: DistEnv) -> TokenBatchStream:
    """One pass over this rank's disjoint part of the validation split, in a fixed order."""
    return TokenBatchStream(
        data_dir, "valid", data_cfg, rank=env.rank, world_size=env.world_size,
        shuffle=False, epochs=1,
    )  # fmt: skip


@torch.no_grad()
def validation_loss(
    engine: Any,
    data_dir: Path,
    data_cfg: DataConfig,
    env: DistEnv,
    epsilon: float,
    max_batches: int = 0,
) -> dict[str, float]:
    """Label-smoothed loss and perplexity (from the NLL) per target token over the valid split."""
    stream = valid_stream(data_dir, data_cfg, env)
    totals = torch.zeros(3, dtype=torch.float64, device=env.device)  # loss, nll, tokens
    first = None
    engine.eval()
    local = iter(stream)
    if max_batches:
        local = (b for i, b in zip(range(max_batches), stream, strict=False))
    for batch in _lockstep(local, env.device):
        if batch is None:
            if first is None or engine.zero_optimization_stage() < 3:
                continue
            batch = first  # keeps ZeRO-3's parameter gathering in step; result discarded
            weight = 0.0
        else:
            first = first or batch
            weight = 1.0
        batch = batch.to(env.device)
        loss, nll, ntok = engine(
            batch.src, batch.tgt_in, batch.tgt_out, epsilon, src_padded=batch.src_padded
        )
        totals += weight * torch.stack([loss.double(), nll.double(), ntok.double()])
    engine.train()
    stream.close()
    dist.all_reduce(totals)
    loss_sum, nll_sum, tokens = totals.tolist()
    if tokens == 0:
        return {}
    return {"valid_loss": loss_sum / tokens, "valid_ppl": math.exp(min(nll_sum / tokens, 50.0))}


def decoding_model(engine: Any) -> torch.nn.Module:
    """The module to decode with: the engine's own, or under ZeRO-3 a full local copy.

    ZeRO-3 gathers a submodule's parameters only around that submodule's forward, so a search
    that calls `encode`/`decode` directly (and the tied output projection, which uses the
    embedding outside the embedding's forward) needs the parameters gathered once into a plain
    module. Collective: every rank must call it.
    """
    module = engine.module
    if engine.zero_optimization_stage() < 3:
        return module
    import deepspeed

    params = list(module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    copy = Transformer(module.cfg).to(device=next(iter(state.values())).device)
    copy.load_state_dict(state)
    return copy.to(dtype=next(iter(state.values())).dtype)


@torch.no_grad()
def validation_bleu(
    engine: Any,
    data_dir: Path,
    data_cfg: DataConfig,
    tokenizer: Tokenizer,
    env: DistEnv,
    samples: int,
    beam: int = 1,
    reference_lengths: bool = False,
) -> dict[str, float]:
    """Decode the first `samples` validation pairs (beam search; 1 = greedy), sharded by rank
    and gathered; sacreBLEU on rank 0. `reference_lengths`: each output is as long as its
    reference (EOS included), as a trained model's roughly is: a budget's probe times this."""
    stream = valid_stream(data_dir, data_cfg, env)
    per_rank = math.ceil(samples / env.world_size)
    hyps: list[str] = []
    refs: list[str] = []
    model = decoding_model(engine)
    model.eval()
    with torch.no_grad():  # as validation loss: one no-grad graph per compiled layer
        for batch in stream:
            if len(refs) >= per_rank:
                break
            batch = batch.to(env.device)
            need = per_rank - len(refs)  # only the sentences asked for, not the whole batch
            src = batch.src[:need]  # (B', S)
            lens = batch.tgt_out[:need].ne(PAD_ID).sum(dim=1) if reference_lengths else None
            if beam == 1:
                out = greedy_search(model, src, max_lens=lens)
            else:
                out = [hyps[0].tokens for hyps in beam_search(model, src, beam, max_lens=lens)]
            hyps.extend(tokenizer.decode(out))
            refs.extend(batch.tgt_text[:need])
    stream.close()
    engine.module.train()
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, (hyps, refs))
    if not env.is_main:
        return {}
    all_hyps = [h for part in gathered for h in part[0]]
    all_refs = [r for part in gathered for r in part[1]]
    if not all_hyps:
        return {}
    return {"bleu": sacrebleu.corpus_bleu(all_hyps, [all_refs]).score}


class Evaluator:
    """Validation during training, with the random streams put back afterwards, so that a
    run's training does not depend on when it evaluated (a resumed run evaluates at its end).
    Also a budget's probe (trainer/budget.py): `validation` and `decode` are what it times."""

    def __init__(self, engine: Any, job: Any, tokenizer: Tokenizer, env: DistEnv) -> None:
        """`job`: the run's configuration (its data, train and model sections)."""
        self.engine, self.tokenizer, self.env = engine, tokenizer, env
        self.data_dir, self.data_cfg = Path(job.data.dir), job.data
        self.cfg, self.epsilon = job.train, job.model.label_smoothing
        self.bleu_samples = bleu_samples(job.train)  # all of them for a BLEU target

    def run(self, with_bleu: bool) -> dict[str, float]:
        """Validation loss and perplexity, and BLEU of train.bleu_samples sentences (all of
        them for a BLEU target)."""
        out = self.validation()
        if with_bleu:
            with rng_preserved():
                out |= self._bleu(self.bleu_samples)
        return out

    def validation(self) -> dict[str, float]:
        with rng_preserved():
            return validation_loss(
                self.engine, self.data_dir, self.data_cfg, self.env, self.epsilon,
                self.cfg.eval_max_batches,
            )  # fmt: skip

    def decode(self, samples: int) -> None:
        """A budget's probe: `samples` sentences decoded as long as their references."""
        with rng_preserved():
            self._bleu(samples, reference_lengths=True)

    def _bleu(self, samples: int, reference_lengths: bool = False) -> dict[str, float]:
        return validation_bleu(
            self.engine, self.data_dir, self.data_cfg, self.tokenizer, self.env, samples,
            self.cfg.bleu_beam, reference_lengths,
        )  # fmt: skip
