"""Shape and regularisation settings of the encoder-decoder Transformer."""

from __future__ import annotations

from dataclasses import dataclass

# Special token ids, fixed for every tokenizer this project trains (sentencepiece ids).
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

# Logits per chunk of the training loss on a CPU (model/loss.py): 64 MiB in fp32. Here, not
# in model/loss.py, so that the planner (launch/cost_model/activations.py) reads it without torch.
LOSS_CHUNK_ELEMENTS = 2**24
LOSS_W_SLICE_ROWS = 4096  # vocabulary rows of the projection's gradient per product (model/loss.py)
# On a GPU a chunk may take this share of the device's memory, at 4 bytes a logit (the bf16
# logits and their softmax): 625M logits on 80 GB, a whole micro-batch of the big model at
# MLPerf's 13,824 tokens (511M), where 2^24 made ~31 chunks of ~90 small kernels each.
LOSS_GPU_MEMORY_SHARE = 1 / 32


@dataclass(frozen=True)
class LossChunking:
    """How model/loss.py cuts the loss: logits per chunk, and vocabulary rows per product of the
    projection's gradient (None: the whole vocabulary in one product)."""

    elements: int = LOSS_CHUNK_ELEMENTS
    w_slice_rows: int | None = LOSS_W_SLICE_ROWS


def loss_chunking(gpu_memory_bytes: float | None) -> LossChunking:
    """The chunking for a device: a CPU's (None) bounds each chunk to 64 MiB of fp32 logits and
    each gradient product to 4,096 rows, as a CPU's memory and caches favour; a GPU's chunk is
    LOSS_GPU_MEMORY_SHARE of its memory (never less than a CPU's) with one gradient product."""
    if gpu_memory_bytes is None:
        return LossChunking()
    elements = max(LOSS_CHUNK_ELEMENTS, int(gpu_memory_bytes * LOSS_GPU_MEMORY_SHARE / 4))
    return LossChunking(elements, None)


@dataclass
class ModelConfig:
    """The paper's architecture; defaults are the base model of Table 3.

    `vocab_size` None means "take it from the data's tokenizer" (the trainer fills it in).
    """

    vocab_size: int | None = None  # shared source/target vocabulary; null: the tokenizer's
    d_model: int = 512  # width of embeddings and every sublayer (d_model in the paper)
    n_heads: int = 8  # attention heads (h); must divide d_model
    d_ff: int = 2048  # inner width of the feed-forward blocks
    encoder_layers: int = 6  # N of the encoder stack
    decoder_layers: int = 6  # N of the decoder stack
    dropout: float = 0.1  # embeddings + every sublayer output (P_drop in the paper)
    attention_dropout: float = 0.0  # on the attention weights
    activation_dropout: float = 0.0  # inside the feed-forward block, after the ReLU
    pre_norm: bool = False  # the paper is post-LN
    max_positions: int = 1024  # longest sequence the sinusoidal position table covers
    label_smoothing: float = 0.1  # epsilon_ls of the training loss
    init_std: float | None = None  # None: fairseq's init (Transformer.reset_parameters)

    def problems(self) -> list[tuple[str, str]]:
        """(key, message) for each invalid value; empty when the config is usable."""
        out: list[tuple[str, str]] = []
        positive = {
            "d_model": self.d_model,
            "n_heads": self.n_heads,
            "d_ff": self.d_ff,
            "encoder_layers": self.encoder_layers,
            "decoder_layers": self.decoder_layers,
            "max_positions": self.max_positions,
        }
        for key, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                out.append((key, f"must be a positive integer, got {value!r}"))
        if self.vocab_size is not None and (
            not isinstance(self.vocab_size, int) or self.vocab_size < 8
        ):
            out.append(("vocab_size", f"must be an integer >= 8 or null, got {self.vocab_size!r}"))
        if not out and self.d_model % self.n_heads != 0:
            out.append(("d_model", f"{self.d_model} is not divisible by n_heads={self.n_heads}"))
        if not out and self.d_model % 2 != 0:
            out.append(("d_model", f"must be even for sinusoidal positions, got {self.d_model}"))
        for key in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                out.append((key, f"must be in [0, 1), got {value!r}"))
        if self.init_std is not None and not self.init_std > 0:
            out.append(("init_std", f"must be > 0 or null, got {self.init_std!r}"))
        return out

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads
