"""The token rules of model/search.py as a Transformers LogitsProcessor.

`generate` scores beams on log-probabilities after its logits processors (beam search) or
takes the argmax of the processed logits (greedy), so one processor that does what
`_next_log_probs` does to our log-probabilities makes Transformers search the same space:

- PAD and BOS are never generated;
- no EOS before `min_len`;
- at a sentence's own limit max_len = floor(a * src_len + b) only EOS is allowed, and it keeps
  its log-probability.

The last rule is why `forced_eos_token_id` is switched off when this processor is used: that
processor fires at one batch-wide length and sets EOS's log-probability to 0, so a hypothesis
that reaches the limit would score higher than in our search.
"""

from __future__ import annotations

import math

from torch import Tensor

from model.config import BOS_ID, EOS_ID, PAD_ID
from serve.optional import require

LogitsProcessor = require("transformers").LogitsProcessor


class SearchRules(LogitsProcessor):  # type: ignore[misc,valid-type]
    """Per-row length limits and forbidden tokens, for rows laid out sentence-major
    (row r = sentence r // beams), which is how `generate` flattens beams."""

    def __init__(self, max_lens: Tensor, beams: int, min_len: int = 0) -> None:
        self.row_max = max_lens.repeat_interleave(beams)  # (B*K,)
        self.min_len = min_len

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        """input_ids (B*K, step) start with BOS, so `step` is the 1-based index of the token
        being chosen, as in model/search.py; scores (B*K, V) -> (B*K, V)."""
        step = input_ids.shape[1]
        scores = scores.clone()
        scores[:, PAD_ID] = -math.inf
        scores[:, BOS_ID] = -math.inf
        if step < self.min_len:
            scores[:, EOS_ID] = -math.inf
        at_max = self.row_max.to(scores.device).le(step)  # (B*K,)
        if bool(at_max.any()):
            eos = scores[:, EOS_ID].clone()  # (B*K,)
            scores[at_max] = -math.inf
            scores[:, EOS_ID] = eos
        return scores


def rules_for(src: Tensor, beams: int, max_len_a: float, max_len_b: int) -> SearchRules:
    """The rules for a PAD-padded source batch (B, S), limits as model.search.max_lengths."""
    from model.search import max_lengths

    return SearchRules(max_lengths(src, max_len_a, max_len_b), beams)


def rows_max(rules: SearchRules) -> int:
    """The longest limit of the batch: `max_new_tokens` for `generate`."""
    return int(rules.row_max.max())
