"""A small synthetic parallel corpus: deterministic, varied lengths, real enough for spm."""

from __future__ import annotations

import random
from pathlib import Path

SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "gu", "shi", "an", "er"]


def _words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n)]


def make_corpus(
    root: Path, *, train: int = 3000, valid: int = 150, test: int = 150, seed: int = 0
) -> Path:
    """Write ``{train,valid,test}.{en,de}`` under ``root`` and return ``root``.

    German is a word-by-word "translation" through a fixed dictionary plus an occasional
    extra word, so lengths correlate like real data; sentence lengths spread from 1 to ~60
    words so that length bucketing and max_len filtering have something to do.
    """
    rng = random.Random(seed)
    en_words = _words(rng, 400)
    de_words = [w[::-1] + rng.choice(["en", "er", "e", ""]) for w in en_words]
    lexicon = dict(zip(en_words, de_words, strict=True))
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("valid", valid), ("test", test)):
        with open(root / f"{split}.en", "w") as fe, open(root / f"{split}.de", "w") as fd:
            for _ in range(n):
                length = min(int(rng.expovariate(1 / 12)) + 1, 70)
                en = [rng.choice(en_words) for _ in range(length)]
                de = [lexicon[w] for w in en]
                if rng.random() < 0.3:
                    de.insert(rng.randrange(len(de) + 1), rng.choice(de_words))
                fe.write(" ".join(en).capitalize() + ".\n")
                fd.write(" ".join(de).capitalize() + ".\n")
    return root
