"""`fetch_debian_ende`: the human-translated English-German corpus from Debian's archive.

Sources: the Ding dictionary (package ``trans-de-en``: example sentences and multi-word phrases),
DDTP package-description translations (``Translation-de`` vs ``Translation-en``) and, optionally,
the German gettext catalogs installed on this machine. Downloads go through a private apt
(`PrivateApt`) whose lists and cache live in ``DIR/.cache``; a second run reuses them and needs
no network (pass ``refresh=True`` to fetch again).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from data_pipeline.corpus import ddtp, ding, gettext_catalogs
from data_pipeline.corpus.apt import PrivateApt, extract_deb
from data_pipeline.corpus.clean import FilterRules, clean_pairs
from data_pipeline.corpus.errors import CorpusUnavailable, unavailable
from data_pipeline.corpus.pairs import RawPair
from data_pipeline.corpus.split import SPLITS, split_pairs, write_split

DING_PACKAGE = "trans-de-en"


def _ding_pairs(
    apt: PrivateApt, cache: Path, refresh: bool, log: Callable[[str], None]
) -> tuple[list[RawPair], str]:
    """Download (or reuse) and parse the Ding dictionary; return pairs and the .deb's name."""
    deb_dir = cache / "ding"
    debs = sorted(deb_dir.glob(f"{DING_PACKAGE}_*.deb"))
    if refresh or not debs:
        log(f"downloading {DING_PACKAGE} ...")
        try:
            deb = apt.download(DING_PACKAGE, deb_dir)
        except CorpusUnavailable:
            if refresh:
                raise
            log("download failed with the cached lists; apt-get update and retry ...")
            apt.update()  # the cached lists may name a version the archive no longer has
            deb = apt.download(DING_PACKAGE, deb_dir)
    else:
        deb = debs[-1]
    unpacked = deb_dir / deb.stem
    path = unpacked / ding.DING_PATH
    if not path.exists():
        extract_deb(deb, unpacked)
    if not path.exists():
        raise unavailable(f"{deb.name} has no {ding.DING_PATH}")
    pairs = ding.read_ding(path)
    log(f"ding: {len(pairs)} raw pairs from {deb.name}")
    return pairs, deb.name


def _ddtp_pairs(apt: PrivateApt, log: Callable[[str], None]) -> tuple[list[RawPair], list[str]]:
    """Parse the private lists' Translation-en/-de indexes into pairs."""
    en_files, de_files = apt.translation_files("en"), apt.translation_files("de")
    en_paras: list[dict[str, str]] = []
    for f in en_files:
        en_paras.extend(ddtp.parse_deb822(apt.cat_file(f)))
    de_paras: list[dict[str, str]] = []
    for f in de_files:
        de_paras.extend(ddtp.parse_deb822(apt.cat_file(f)))
    pairs = list(ddtp.pair_translations(en_paras, de_paras))
    log(f"ddtp: {len(pairs)} raw pairs from {len(de_paras)} German descriptions")
    return pairs, [f.name for f in en_files + de_files]


def _gettext_pairs(
    pre_filtered: Counter[str], log: Callable[[str], None]
) -> tuple[list[RawPair], list[str]]:
    """Pairs from the gettext catalogs installed here, and the catalogs' paths."""
    paths = gettext_catalogs.catalog_paths()
    pairs = list(gettext_catalogs.catalog_pairs(paths, pre_filtered))
    log(f"gettext: {len(pairs)} raw pairs from {len(paths)} catalogs")
    return pairs, [str(p) for p in paths]


def source_counts(
    raw_counts: Counter[str], splits: dict[str, list[RawPair]]
) -> dict[str, dict[str, int]]:
    """Per source (e.g. "ding/example"): pairs raw, kept, and in each split."""
    sources: dict[str, dict[str, int]] = {}
    for source, n in sorted(raw_counts.items()):
        sources[source] = {"raw": n, "kept": 0, **dict.fromkeys(SPLITS, 0)}
    for split in SPLITS:
        for p in splits[split]:
            sources[p.source][split] += 1
            sources[p.source]["kept"] += 1
    return sources


def family_counts(sources: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The per-source counts summed per family (the part before "/": ding, ddtp, gettext)."""
    families: dict[str, dict[str, int]] = {}
    for source, counts in sources.items():
        fam = families.setdefault(source.split("/", 1)[0], {})
        for k, v in counts.items():
            fam[k] = fam.get(k, 0) + v
    return families


def _raw_pairs(
    apt: PrivateApt, cache: Path, refresh: bool, include_gettext: bool, log: Callable[[str], None]
) -> tuple[list[RawPair], Counter[str], dict]:
    """Every source's raw pairs, what the gettext reader filtered already, and corpus.json's
    record of the inputs."""
    ding_raw, ding_deb = _ding_pairs(apt, cache, refresh, log)
    ddtp_raw, index_files = _ddtp_pairs(apt, log)
    pre_filtered: Counter[str] = Counter()
    gettext_raw, catalogs = _gettext_pairs(pre_filtered, log) if include_gettext else ([], [])
    inputs = _inputs_record(ding_deb, index_files, catalogs)
    return ding_raw + ddtp_raw + gettext_raw, pre_filtered, inputs


def _inputs_record(ding_deb: str, index_files: list[str], catalogs: list[str]) -> dict:
    return {"ding": ding_deb, "ddtp_indexes": index_files, "gettext_catalogs": len(catalogs)}


def _rules_record(rules: FilterRules) -> dict[str, object]:
    return {
        "min_words": rules.min_words,
        "max_words": rules.max_words,
        "max_char_ratio": rules.max_ratio,
        "ratio_floor_chars": rules.ratio_floor,
        "dedup": "exact pair, then one target per source (first wins)",
        "split": "whole groups (shared en or de string, dictionary line, package)",
    }


def fetch_debian_ende(
    out_dir: Path,
    *,
    include_gettext: bool = False,
    seed: int = 1,
    valid_size: int = 1000,
    test_size: int = 1000,
    log: Callable[[str], None] = print,
    min_words: int = 3,
    max_words: int = 60,
    train_order: str = "shuffled",
    refresh: bool = False,
    apt_sources: str | None = None,
    apt_options: dict[str, str] | None = None,
) -> dict:
    """Build the Debian English-German corpus in `out_dir`; return the stats of corpus.json.

    Writes ``train/valid/test.{en,de}`` and ``corpus.json``. Raises `CorpusUnavailable` (one-line
    message) when the archive cannot be reached. `min_words`/`max_words` bound the words per
    side (3 drops most dictionary headwords; German compounds make 2 keep about twice as many
    Ding pairs). `train_order` "source" groups the training pairs by source, as a corpus
    concatenated from its parts arrives (valid/test unchanged). `apt_sources` (deb822 text)
    and `apt_options` override the system's apt sources and settings (tests point them at an
    unreachable mirror).
    """
    started = time.monotonic()
    out_dir = Path(out_dir)
    cache = out_dir / ".cache"
    apt = PrivateApt(cache / "apt", sources=apt_sources, options=apt_options)
    if refresh or not apt.has_lists():
        log("apt-get update (private lists, English and German translations) ...")
        apt.update()
    raw, pre_filtered, inputs = _raw_pairs(apt, cache, refresh, include_gettext, log)
    raw_counts = Counter(p.source for p in raw)
    rules = FilterRules(min_words=min_words, max_words=max_words)
    kept, filtered = clean_pairs(raw, rules)
    filtered.update(pre_filtered)
    log(f"clean: {len(kept)} pairs kept of {len(raw)}")
    splits = split_pairs(kept, valid_size=valid_size, test_size=test_size, seed=seed)
    if train_order == "source":
        splits["train"] = sorted(splits["train"], key=lambda p: p.source)  # stable
    for split in SPLITS:
        write_split(out_dir, split, splits[split])
    sources = source_counts(raw_counts, splits)
    stats = {
        "kind": "debian-ende",
        "direction": "en-de",
        "seed": seed,
        "train_order": train_order,
        "splits": {s: len(splits[s]) for s in SPLITS},
        "families": family_counts(sources),
        "sources": sources,
        "filtered": dict(sorted(filtered.items())),
        "rules": _rules_record(rules),
        "inputs": inputs,
    }
    (out_dir / "corpus.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    counts = ", ".join(f"{s} {len(splits[s])}" for s in SPLITS)
    log(f"wrote {counts} pairs to {out_dir} in {time.monotonic() - started:.0f}s")
    return stats
