"""Time to a target quality, for `paperscale plan`: steps from a published (or measured) run's
token budget, time from the plan's step time and what the run spends beside its steps
(launch/cost_model/run_time.py).

An anchor is a published run of the paper's base or big model on WMT'14 English-German (or, for
the synthetic task, a run measured here): its
batch (padded tokens per side per step, as `data.max_tokens x train.grad_accum x ranks` counts
them), the steps it took and the BLEU it reached, as its source measured it. The plan takes the
anchor of the config's model whose batch is nearest its own (or `--anchor NAME`) and assumes the
same tokens reach the same BLEU at the planned batch:

    steps = ceil(anchor batch x anchor steps / planned tokens per step),  time = steps x step_s

That is exact at the anchor's batch; above it, large-batch training needs more tokens to the same
loss once the batch passes the task's critical batch size, so the estimate is optimistic there,
and pessimistic below it. The anchors:

  paper-base, paper-big: Vaswani et al. 2017, section 5.1 ("approximately 25000 source tokens
    and 25000 target tokens" per step), 5.2 (base 100,000 steps, big 300,000) and Table 2 (27.3
    and 28.4 BLEU on newstest2014).
  mlperf-v0.7: MLPerf Training v0.7, NVIDIA's closed-division DGX A100 submission (one node of 8
    A100: 13,824 tokens per GPU, 110,592 per step; fairseq's pre-norm big "t2t" model, dropout
    0.1, Adam (0.9, 0.98), lr 1.9e-3, 750 warm-up steps); its log (NVIDIA/results/dgxa100_
    ngc20.06_pytorch/transformer/result_0.txt) shows 25.27 uncased BLEU (target 25.0) after 3
    epochs, 3,632 steps, 472 s of training, 505 s in all.
  fairseq-scaling: Ott et al. 2018, "Scaling Neural Machine Translation" (big model, 3,584 tokens
    per GPU x 8 GPUs x 16 accumulated = 458,752 per step, lr 1e-3, inverse_sqrt, 4,000 warm-up
    steps from 1e-7): 29.3 BLEU; trained "for 70 epochs or ~24k steps using the large batch
    size" (its first author, fairseq issue #1976). The abstract: the paper's 28.4 in under 5 h
    on 8 GPUs, 29.3 in 85 min on 128.
  synthetic-90: configs/synthetic.yaml (the synthetic task, `paperscale corpus synthetic`'s
    defaults) on 2 CPU ranks of a 2-core AMD EPYC with avx512_bf16 (bf16, 2 x 2,048 tokens per
    step), 2026-12-07: validation BLEU (greedy, the whole split, every 200 steps) first >= 90 at
    step 800 with train.seed 2 and with seed 3 (BLEU 95.5 and 92.3 there, 81.4 and 76.3 at step
    600). Its steps hold for this recipe on this data; an fp32 run (a CPU without native bf16)
    takes its own path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from model.config import ModelConfig

# (d_model, d_ff, n_heads, encoder_layers, decoder_layers, vocab_size or None for any) of the
# paper's two models and of the synthetic task's (its vocabulary names its data)
SHAPES = {
    "base": (512, 2048, 8, 6, 6, None),
    "big": (1024, 4096, 16, 6, 6, None),
    "synthetic": (128, 512, 4, 2, 2, 300),
}


@dataclass(frozen=True)
class Anchor:
    """One published run: its model, batch, steps and the BLEU they reached."""

    name: str
    model: str  # a key of SHAPES
    bleu: float
    batch_tokens: int  # padded tokens per side per step
    steps: int
    pre_norm: bool
    source: str

    @property
    def tokens(self) -> int:
        """Tokens per side the run trained on to reach `bleu`."""
        return self.batch_tokens * self.steps


ANCHORS: tuple[Anchor, ...] = (
    Anchor(
        "paper-base", "base", 27.3, 25_000, 100_000, False,
        "Vaswani et al. 2017: base, 100k steps of ~25k tokens per side",
    ),
    Anchor(
        "paper-big", "big", 28.4, 25_000, 300_000, False,
        "Vaswani et al. 2017: big, 300k steps of ~25k tokens per side",
    ),
    Anchor(
        "mlperf-v0.7", "big", 25.0, 110_592, 3_632, True,
        "MLPerf Training v0.7, DGX A100: pre-norm big, 3,632 steps of 8 x 13,824 tokens, "
        "25.27 uncased in 505 s",
    ),
    Anchor(
        "fairseq-scaling", "big", 29.3, 458_752, 24_000, False,
        "Ott et al. 2018: big, ~24k steps of 8 x 3,584 x 16 tokens (70 epochs)",
    ),
    Anchor(
        "synthetic-90", "synthetic", 90.0, 4_096, 800, False,
        "measured: configs/synthetic.yaml on 2 CPU ranks (bf16), first >= 90 at step 800",
    ),
)  # fmt: skip


def model_kind(cfg: ModelConfig) -> str | None:
    """'base', 'big' or 'synthetic' when the config has that model's shape, else None."""
    shape = (cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.encoder_layers, cfg.decoder_layers)
    return next(
        (
            k
            for k, (*s, vocab) in SHAPES.items()
            if tuple(s) == shape and vocab in (None, cfg.vocab_size)
        ),
        None,
    )


def pick_anchor(cfg: ModelConfig, step_tokens: int, name: str | None = None) -> Anchor | None:
    """The anchor named, or the one of the config's model that follows its recipe: the same
    layer norm placement first (a pre-norm config is MLPerf's recipe), then the batch nearest
    `step_tokens` (on a log scale); None when the model is none of SHAPES'. ValueError
    for a name that is not an anchor or is one of another model."""
    kind = model_kind(cfg)
    if name is not None:
        anchor = next((a for a in ANCHORS if a.name == name), None)
        if anchor is None:
            raise ValueError(f"no anchor {name!r}; known: {', '.join(a.name for a in ANCHORS)}")
        if anchor.model != kind:
            raise ValueError(f"anchor {name} is for the {anchor.model} model, not this config's")
        return anchor
    mine = [a for a in ANCHORS if a.model == kind]
    if not mine:
        return None
    return min(
        mine,
        key=lambda a: (a.pre_norm != cfg.pre_norm, abs(math.log(step_tokens / a.batch_tokens))),
    )


def time_to_quality(
    anchor: Anchor, step_tokens: int, step_s: float, pre_norm: bool
) -> dict[str, float | int | str | bool]:
    """Steps and hours to the anchor's BLEU at `step_tokens` padded tokens per side per step."""
    steps = math.ceil(anchor.tokens / step_tokens)
    return {
        "anchor": anchor.name,
        "bleu": anchor.bleu,
        "source": anchor.source,
        "anchor_batch_tokens": anchor.batch_tokens,
        "anchor_steps": anchor.steps,
        "anchor_tokens": anchor.tokens,
        "norm_differs": anchor.pre_norm != pre_norm,
        "steps": steps,
        "hours": steps * step_s / 3600,
    }


def duration(hours: float) -> str:
    """'95 s' under two minutes, '42 min' under two hours, else '3.4 h' (or '12 d' past four
    days)."""
    if hours * 60 < 2:
        return f"{hours * 3600:.0f} s"
    if hours < 2:
        return f"{hours * 60:.0f} min"
    return f"{hours:.1f} h" if hours < 96 else f"{hours / 24:.1f} d"


def quality_lines(q: dict | None, step_tokens: int) -> list[str]:
    """The reasoning behind the time to the anchor's BLEU, as `plan` prints it."""
    if not q:
        return [
            "time to BLEU     no anchor for this model (anchors: the paper's base and big shapes, "
            "the synthetic task's)"
        ]
    ratio = step_tokens / int(q["anchor_batch_tokens"])
    side = "exact" if abs(ratio - 1) < 0.01 else ("optimistic" if ratio > 1 else "pessimistic")
    lines = [
        f"time to BLEU     {q['bleu']:.1f} ({q['anchor']}: {q['source']})",
        f"                 {int(q['anchor_tokens']):.3g} tokens per side / {step_tokens:,} per "
        f"step = {int(q['steps']):,} steps -> {duration(float(q['hours']))}",
        f"                 same tokens as the anchor at {ratio:.2f} x its batch: {side} "
        "(--anchor NAME picks another)",
    ]
    if q["norm_differs"]:
        lines.append(f"{'':17}the anchor's layer norm placement differs from this config's")
    return lines
