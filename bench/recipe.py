"""paperscale's recipe as a bare PyTorch loop (BareLoop), and the same data and recipe in
fairseq's terms (binarized pieces, fairseq-train's arguments, bench/fairseq_worker.py)."""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentencepiece
import torch

from bench.common import ROOT, SMOKE_MODEL, run_command
from data_pipeline.loader import Batch, TokenBatchStream
from data_pipeline.manifest import read_manifest, tokenizer_path
from data_pipeline.shards import decode_sample, iter_shard
from data_pipeline.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from launch.config import load_config
from model.config import ModelConfig
from model.transformer import Transformer
from trainer.ds.engine import resolve_model_config, seed_everything
from trainer.schedule import build_scheduler, inverse_sqrt_lr, peak_lr

# fairseq's dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3, then our pieces in our order
FAIRSEQ_SPECIAL = {PAD_ID: 1, UNK_ID: 3, BOS_ID: 0, EOS_ID: 2}


def fairseq_data(fairseq_python: str, job: Any, work: Path) -> Path:
    """The job's train/valid pairs as pieces, in the order our loader reads them (training
    pairs over max_len skipped as it skips them), binarized by fairseq-preprocess with our
    vocabulary as dict.txt under `work`: the binary directory."""
    data, text, out = Path(job.data.dir), work / "fairseq-text", work / "fairseq-bin"
    text.mkdir(parents=True, exist_ok=True)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_path(data)))
    m = read_manifest(data)
    vocab = sp.get_piece_size()
    with open(text / "dict.txt", "w") as f:
        f.writelines(f"{sp.id_to_piece(i)} {vocab - i}\n" for i in range(4, vocab))
    for split in ("train", "valid"):
        with open(text / f"{split}.src", "w") as fs, open(text / f"{split}.tgt", "w") as ft:
            for shard in m["splits"][split]["shards"]:
                for raw in iter_shard(data / shard["name"]):
                    src, tgt = decode_sample(raw, m["dtype"], vocab)
                    if split == "train" and max(len(src), len(tgt) + 1) > job.data.max_len:
                        continue
                    fs.write(" ".join(sp.id_to_piece(int(i)) for i in src[:-1]) + "\n")
                    ft.write(" ".join(sp.id_to_piece(int(i)) for i in tgt) + "\n")
    shutil.rmtree(out, ignore_errors=True)  # fairseq-preprocess refuses an existing dictionary
    run_command(
        [
            fairseq_python, "-m", "fairseq_cli.preprocess", "--source-lang", "src",
            "--target-lang", "tgt", "--trainpref", str(text / "train"),
            "--validpref", str(text / "valid"), "--srcdict", str(text / "dict.txt"),
            "--joined-dictionary", "--destdir", str(out), "--workers", "2",
        ],
        work / "fairseq-preprocess.log",
    )  # fmt: skip
    return out


def fairseq_recipe(job: Any, model_cfg: ModelConfig) -> list[str]:
    """fairseq-train arguments of the preset's model and recipe (fp32, no clipping unless set)."""
    m, o = model_cfg, job.optim
    peak = o.lr if o.lr is not None else peak_lr(m.d_model, o.warmup_steps)
    return [
        "--cpu", "--task", "translation", "-s", "src", "-t", "tgt",
        "--arch", "transformer", "--share-all-embeddings",
        "--encoder-layers", str(m.encoder_layers), "--decoder-layers", str(m.decoder_layers),
        "--encoder-embed-dim", str(m.d_model), "--decoder-embed-dim", str(m.d_model),
        "--encoder-ffn-embed-dim", str(m.d_ff), "--decoder-ffn-embed-dim", str(m.d_ff),
        "--encoder-attention-heads", str(m.n_heads), "--decoder-attention-heads", str(m.n_heads),
        "--dropout", str(m.dropout), "--attention-dropout", str(m.attention_dropout),
        "--activation-dropout", str(m.activation_dropout),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(m.label_smoothing),
        "--optimizer", "adam", "--adam-betas", f"({o.beta1},{o.beta2})", "--adam-eps", str(o.eps),
        "--weight-decay", str(o.weight_decay), "--clip-norm", str(o.clip_grad),
        "--lr", str(peak), "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(o.warmup_steps), "--warmup-init-lr", str(o.warmup_init_lr),
        "--max-tokens", str(job.data.max_tokens), "--seed", str(job.train.seed),
    ]  # fmt: skip


def worker(fairseq_python: str, work: Path, command: str, spec: dict[str, Any], *rest: str) -> str:
    """bench/fairseq_worker.py's `command` under fairseq's python (one thread): its output."""
    spec_path, log = work / "fairseq-spec.json", work / f"fairseq-{command}.log"
    spec_path.write_text(json.dumps(spec))
    cmd = [fairseq_python, str(ROOT / "bench" / "fairseq_worker.py"), command, str(spec_path)]
    run_command([*cmd, *rest], log, {"OMP_NUM_THREADS": "1"})
    return log.read_text()


def load_job(config: str, data: Path, smoke: bool) -> tuple[Any, list[str]]:
    """The preset on `data` (the smoke model at smoke size), and its overrides."""
    overrides = [f"data.dir={data}", *(SMOKE_MODEL if smoke else [])]
    return load_config(ROOT / config, overrides), overrides


def model_config(job: Any, **changes: Any) -> ModelConfig:
    """The preset's model at the vocabulary of its data's tokenizer, with `changes`."""
    cfg = resolve_model_config(job.model, Tokenizer(tokenizer_path(Path(job.data.dir))))
    return ModelConfig(**{**cfg.__dict__, **changes})


def dump_batches(job: Any, micro: int) -> list[Batch]:
    """The first `micro` micro-batches of a one-rank stream with the preset's data settings."""
    cfg = job.data.__class__(**{**job.data.__dict__, "num_workers": 0})
    stream = TokenBatchStream(Path(job.data.dir), "train", cfg)
    out = list(itertools.islice(stream, micro))
    stream.close()
    return out


def initial_weights(cfg: ModelConfig, seed: int, xavier: bool = False) -> dict[str, torch.Tensor]:
    """paperscale's initial weights of `cfg` from `seed`; with `xavier` its init before the
    fairseq comparison: xavier-uniform on every (out, in) projection, zero biases."""
    seed_everything(seed)
    model = Transformer(cfg)
    for module in model.modules() if xavier else ():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.xavier_uniform_(module.weight)
            torch.nn.init.zeros_(module.bias)
    return model.state_dict()


class BareLoop:
    """paperscale's recipe without the trainer, in plain PyTorch: the model from `init` (else
    from `seed`), torch Adam, the inverse-sqrt schedule (with `fairseq_lr` fairseq's: update k
    uses lr(k - 1)), per step the summed label-smoothed losses of its micro-batches over their
    target tokens; bf16 autocast with `bf16`. The reference the trainer is held to
    (tests/integration/test_reference_recipe.py)."""

    def __init__(
        self, cfg: ModelConfig, optim: Any, seed: int, init: dict[str, torch.Tensor] | None = None,
        fairseq_lr: bool = False, bf16: bool = False,
    ) -> None:  # fmt: skip
        seed_everything(seed)  # the seed, then the model: also the dropout stream after it
        self.model, self.eps, self.bf16 = Transformer(cfg).train(), cfg.label_smoothing, bf16
        if init is not None:
            self.model.load_state_dict(init)
        o = optim
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1.0, betas=(o.beta1, o.beta2),
                                    eps=o.eps)  # fmt: skip
        shape = {"d_model": cfg.d_model, "warmup_steps": o.warmup_steps, "lr": o.lr,
                 "warmup_init_lr": o.warmup_init_lr}  # fmt: skip
        self.sched = (
            torch.optim.lr_scheduler.LambdaLR(
                self.opt, lambda k: inverse_sqrt_lr(k, **shape) if k else o.warmup_init_lr
            )
            if fairseq_lr
            else build_scheduler(self.opt, **shape)
        )

    def step(self, micro: Sequence[Batch], each_its_own: bool = False) -> tuple[float, ...]:
        """One optimizer step on `micro`: (loss, nll, seconds), per target token. With
        `each_its_own`, each micro-batch's loss over its own tokens instead (a recipe that
        differs: the trainer must not match it)."""
        started = time.perf_counter()
        tokens = sum(b.n_tgt_tokens for b in micro)
        loss_sum = nll_sum = 0.0
        for b in micro:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                loss, nll, _ = self.model(b.src, b.tgt_in, b.tgt_out, self.eps,
                                          src_padded=b.src_padded)  # fmt: skip
            (loss / (b.n_tgt_tokens * len(micro) if each_its_own else tokens)).backward()
            loss_sum, nll_sum = loss_sum + float(loss.detach()), nll_sum + float(nll.detach())
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return loss_sum / tokens, nll_sum / tokens, time.perf_counter() - started
