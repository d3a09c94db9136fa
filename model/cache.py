"""State kept between incremental decoding steps (keys/values of every decoder layer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from model.attention import KVCache


@dataclass
class DecoderCache:
    """Per-layer self- and cross-attention keys/values plus the target padding seen so far.

    Create it empty (`DecoderCache()`) and pass it to `Transformer.decode` at every step; the
    first call fills the cross-attention entries from the encoder output, and every call
    appends its positions to the self-attention entries.
    """

    self_kv: list[KVCache] = field(default_factory=list)
    cross_kv: list[KVCache] = field(default_factory=list)
    tgt_pad_mask: Tensor | None = None  # (B, L) bool, True = pad

    @property
    def length(self) -> int:
        """Number of target positions already decoded (L)."""
        return 0 if self.tgt_pad_mask is None else self.tgt_pad_mask.shape[1]

    def ensure_layers(self, n_layers: int) -> None:
        """Create the empty per-layer entries on first use."""
        while len(self.self_kv) < n_layers:
            self.self_kv.append(KVCache())
            self.cross_kv.append(KVCache())

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (LongTensor (B',)) in that order, in place (beam search)."""
        self.reorder_self(index)
        self.reorder_cross(index)

    def reorder_self(self, index: Tensor) -> None:
        """Like `reorder`, but only the self-attention entries and the target padding.

        Enough on its own when `index` maps every row to a row of the same source sentence
        (beam search reshuffling one sentence's beams): the cross-attention entries of those
        rows are identical, so copying them would change nothing.
        """
        for kv in self.self_kv:
            kv.reorder(index)
        if self.tgt_pad_mask is not None:
            self.tgt_pad_mask = self.tgt_pad_mask.index_select(0, index)

    def reorder_cross(self, index: Tensor) -> None:
        """Keep rows `index` of the cross-attention entries only (see `reorder_self`)."""
        for kv in self.cross_kv:
            kv.reorder(index)
