"""Group-aware train/valid/test split and the line-aligned writer.

Pairs are joined into groups (union-find) when they share an English string, a German string
(compared case- and punctuation-insensitively) or a declared group (one dictionary line, one
Debian package). Whole groups are then ordered by a seeded hash and the small ones fill valid
and test; everything else is train. So no English or German side of a valid/test pair occurs in
train, and a package's or dictionary entry's other sentences cannot leak either.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from data_pipeline.corpus.pairs import RawPair

SPLITS = ("train", "valid", "test")
_NON_WORD = re.compile(r"[\W_]+")


def match_key(text: str) -> str:
    """The form under which two strings count as "the same" for leakage: casefolded, words only."""
    return _NON_WORD.sub(" ", text.casefold()).strip()


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def group_pairs(pairs: Sequence[RawPair]) -> list[list[int]]:
    """Indices of `pairs` grouped by shared English key, German key or declared group."""
    uf = _UnionFind(len(pairs))
    first: dict[tuple[str, str], int] = {}
    for i, p in enumerate(pairs):
        for key in (("en", match_key(p.en)), ("de", match_key(p.de)), ("group", p.group)):
            j = first.setdefault(key, i)
            if j != i:
                uf.union(i, j)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(pairs)):
        groups[uf.find(i)].append(i)
    return list(groups.values())


def _rank(seed: int, pair: RawPair) -> str:
    return hashlib.sha256(f"{seed}\x00{pair.en}\x00{pair.de}".encode()).hexdigest()


def split_pairs(
    pairs: Sequence[RawPair],
    *,
    valid_size: int,
    test_size: int,
    seed: int = 1,
    max_heldout_group: int = 16,
) -> dict[str, list[RawPair]]:
    """Split into train/valid/test by whole groups; deterministic for a seed.

    Groups are visited in the order of a seeded hash of their first pair; a group goes to valid
    (then test) if it fits in what is still needed and has at most `max_heldout_group` pairs,
    otherwise to train. Each split is shuffled with the seed.
    """
    groups = group_pairs(pairs)
    order = sorted(groups, key=lambda g: _rank(seed, pairs[min(g)]))
    need = {"valid": valid_size, "test": test_size}
    out: dict[str, list[RawPair]] = {s: [] for s in SPLITS}
    for group in order:
        target = "train"
        if len(group) <= max_heldout_group:
            for split in ("valid", "test"):
                if len(group) <= need[split]:
                    target = split
                    need[split] -= len(group)
                    break
        out[target].extend(pairs[i] for i in sorted(group))
    for i, split in enumerate(SPLITS):
        random.Random(seed * 1000 + i).shuffle(out[split])
    return out


def write_split(out_dir: Path, split: str, pairs: Sequence[RawPair]) -> None:
    """Write ``split.en`` and ``split.de``, one sentence per line, UTF-8, ``\\n`` endings."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        lines = [getattr(p, lang) for p in pairs]
        for line in lines:
            if "\n" in line or "\r" in line or "\t" in line or not line.strip():
                raise ValueError(f"refusing to write an unclean line to {split}.{lang}: {line!r}")
        tmp = out_dir / f"{split}.{lang}.tmp"
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(line + "\n" for line in lines)
        tmp.replace(out_dir / f"{split}.{lang}")
