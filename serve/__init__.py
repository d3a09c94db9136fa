"""Serving a trained model: our own engine, and Transformers and CTranslate2 (the optional
`serve` extra) on exports converted from ours.

engine (what every engine shares: batches, one `translate()`), engine_paperscale (our export
under model/search.py), formats (which export a directory holds), hf_layout (our weights as
MarianMTModel's: names, one permutation of the model dimension, config), hf_tokenizer (our spm
model as MarianTokenizer's files), export_hf / export_ct2 / export_run (`paperscale export
--format`), hf_rules (our search rules as a logits processor), engine_hf / engine_ct2 (their
searches under our rules), engines (one loader for any export).

The exported networks compute our logits (to float rounding, ~1e-6). How the three searches
compare, with model/search.py's vocabulary (beam K, length penalty alpha, |Y| the output
length counting EOS, max_len = floor(a * src_len + b) per sentence, EOS forced there):

- Greedy search: the same tokens in all three.
- Beam search, alpha = 0: Transformers' `generate(num_beams=K, length_penalty=0,
  early_stopping=True/False)` is ours with `early_stop=True/False`: both keep the 2K best
  continuations, finish an EOS among the first K, refill K live beams in rank order, and stop
  after K finished hypotheses (True) or when no live beam beats the K-th finished one (False).
  CTranslate2 with `length_penalty=0` stops when the best candidate of a step ends with EOS;
  since scores only fall, that is the best hypothesis ours finds with `early_stop=False`.
- Beam search, alpha > 0: not the same ranking, by formula. Ours divides a finished
  hypothesis' log-probability by GNMT's ((5 + |Y|) / 6)^alpha; Transformers by |Y|^alpha and
  CTranslate2 by its hypothesis length^alpha (|Y| with `return_end_token`). Neither library
  takes another penalty without code of its own, so with alpha > 0 a different hypothesis of
  the same beam can win. When a sentence stops is the same in all three: after K finished
  hypotheses (ours and Transformers with early stopping, as `paperscale translate` searches;
  CTranslate2 whenever alpha != 0).
- Forbidden tokens: CTranslate2 removes `<pad>` and `<s>` before its softmax, so its
  log-probabilities are renormalised over the other tokens (ours and Transformers' are not);
  a trained model gives those two tokens little probability (label smoothing trains eps / V
  onto each), so the greedy argmax is unchanged, but a beam's near-ties can go another way
  (the test suite compares CTranslate2 with our search over the renormalised distribution).
- Length limits: Transformers' `max_new_tokens` and CTranslate2's `max_decoding_length` are
  one number per call, and at that limit Transformers' `forced_eos_token_id` gives EOS the
  log-probability 0 while CTranslate2 ends the hypothesis without EOS; ours gives EOS its own
  log-probability. Our Transformers engine passes `SearchRules` (per-sentence limits, EOS kept
  at its log-probability) and is then exactly ours; our CTranslate2 engine translates one
  limit per call and asks for max_len - 1 tokens, so only a beam hypothesis that reaches the
  limit can be ranked differently (it lacks the EOS term).
"""
