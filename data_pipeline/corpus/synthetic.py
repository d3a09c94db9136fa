"""A deterministic synthetic "translation" task a small model can learn: mapped reversal.

The source is a random sequence of pseudo-words from a source vocabulary (consonant-vowel
syllables such as ``bato``); the target is the same sequence reversed, each word mapped through
a fixed bijection onto a disjoint target vocabulary (``lezu``). Learning it needs a per-word
lexicon and reordering, the two things attention does, and it is exactly checkable. The same
arguments give byte-identical files, and no valid/test source occurs in another split.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

from data_pipeline.corpus.pairs import RawPair
from data_pipeline.corpus.split import write_split

_SRC_CONSONANTS = "bdgkmnpt"
_TGT_CONSONANTS = "flrsvz"
_VOWELS = "aeiou"


def _words(consonants: str, n: int, rng: random.Random) -> list[str]:
    """`n` distinct pseudo-words made of the fewest syllables (of `consonants`) that suffice."""
    syllables = [c + v for c in consonants for v in _VOWELS]
    length = 1
    while len(syllables) ** length < n:
        length += 1
    length = max(length, 2)
    pool = ["".join(s) for s in itertools.product(syllables, repeat=length)]
    return rng.sample(pool, n) if len(pool) < 200_000 else _sample_large(syllables, length, n, rng)


def _sample_large(syllables: list[str], length: int, n: int, rng: random.Random) -> list[str]:
    out: dict[str, None] = {}
    while len(out) < n:
        out.setdefault("".join(rng.choice(syllables) for _ in range(length)))
    return list(out)


def make_lexicon(vocab: int, seed: int) -> dict[str, str]:
    """The fixed bijection source word -> target word for a vocabulary size and seed."""
    rng = random.Random(f"lexicon:{seed}:{vocab}")
    return dict(
        zip(_words(_SRC_CONSONANTS, vocab, rng), _words(_TGT_CONSONANTS, vocab, rng), strict=True)
    )


def translate(source: str, lexicon: dict[str, str]) -> str:
    """The target of a source sentence: words reversed and mapped."""
    return " ".join(lexicon[w] for w in reversed(source.split()))


def write_synthetic(
    out_dir: Path,
    n_train: int = 20000,
    n_valid: int = 500,
    n_test: int = 500,
    seed: int = 1,
    vocab: int = 50,
    min_len: int = 5,
    max_len: int = 20,
) -> dict:
    """Write the mapped-reversal corpus to `out_dir` (``train.en`` ... ``corpus.json``).

    ``.en`` holds the source, ``.de`` the target, so the files drop in wherever the real corpus
    goes. Returns the stats also written to corpus.json.
    """
    if vocab < 2 or not 1 <= min_len <= max_len or min(n_train, n_valid, n_test) < 0:
        raise ValueError("need vocab >= 2, 1 <= min_len <= max_len and non-negative sizes")
    total = n_train + n_valid + n_test
    capacity = sum(vocab**n for n in range(min_len, max_len + 1))
    if total > capacity // 2:
        raise ValueError(f"{total} distinct sentences asked for, only {capacity} exist")
    out_dir = Path(out_dir)
    lexicon = make_lexicon(vocab, seed)
    words = list(lexicon)
    rng = random.Random(f"sentences:{seed}")
    seen: set[str] = set()
    pairs: list[RawPair] = []
    while len(pairs) < total:
        sent = " ".join(rng.choice(words) for _ in range(rng.randint(min_len, max_len)))
        if sent in seen:
            continue
        seen.add(sent)
        pairs.append(RawPair(en=sent, de=translate(sent, lexicon), source="synthetic", group=""))
    splits = {
        "valid": pairs[:n_valid],
        "test": pairs[n_valid : n_valid + n_test],
        "train": pairs[n_valid + n_test :],
    }
    for split, items in splits.items():
        write_split(out_dir, split, items)
    stats = {
        "kind": "synthetic",
        "task": "mapped reversal: target = reversed source, each word mapped by a fixed lexicon",
        "seed": seed,
        "vocab": vocab,
        "min_len": min_len,
        "max_len": max_len,
        "splits": {s: len(splits[s]) for s in ("train", "valid", "test")},
        "sources": {"synthetic": {s: len(splits[s]) for s in ("train", "valid", "test")}},
        "filtered": {},
        "lexicon": lexicon,
    }
    (out_dir / "corpus.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return stats
