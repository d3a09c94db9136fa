"""`paperscale corpus` and `paperscale prepare`: raw text to a prepared data dir."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from launch.usage import die


def cmd_corpus(args: argparse.Namespace) -> int:
    from data_pipeline.corpus import (
        CorpusUnavailable,
        fetch_debian_ende,
        fetch_wmt14_ende,
        write_synthetic,
    )

    out = Path(args.dir)
    if args.corpus_command == "synthetic":
        try:
            stats = write_synthetic(
                out, n_train=args.train, n_valid=args.valid, n_test=args.test, seed=args.seed,
                min_len=args.min_len, max_len=args.max_len,
            )  # fmt: skip
        except ValueError as exc:
            return die(f"corpus synthetic: {exc}")
    elif args.name == "debian-ende":
        try:
            stats = fetch_debian_ende(
                out,
                include_gettext=args.gettext,
                seed=args.seed,
                valid_size=args.valid,
                test_size=args.test,
                min_words=args.min_words,
                train_order=args.train_order,
                log=lambda msg: print(msg, file=sys.stderr, flush=True),
            )
        except CorpusUnavailable as exc:
            return die(str(exc))
    elif args.name == "wmt14-ende":
        try:
            stats = fetch_wmt14_ende(out, log=lambda msg: print(msg, file=sys.stderr, flush=True))
        except CorpusUnavailable as exc:
            return die(str(exc))
    else:
        return die(f"unknown corpus {args.name!r}; known: debian-ende, wmt14-ende")
    print(json.dumps({"dir": str(out), **stats}, indent=1, default=str))
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from data_pipeline.prepare import prepare

    corpus = Path(args.corpus_dir)
    if not corpus.is_dir():
        return die(f"corpus dir {corpus} does not exist")
    vocab_size = args.vocab_size
    if vocab_size is None:
        from launch.config import load_config

        vocab_size = load_config(args.config, []).data.vocab_size if args.config else 37000
    if vocab_size < 8:
        return die(f"--vocab-size must be >= 8, got {vocab_size}")
    if args.shard_samples < 1:
        return die(f"--shard-samples must be >= 1, got {args.shard_samples}")
    if args.workers < 1:
        return die(f"--workers must be >= 1, got {args.workers}")
    try:
        manifest = prepare(
            corpus,
            Path(args.out_dir),
            vocab_size=vocab_size,
            src_lang=args.src,
            tgt_lang=args.tgt,
            workers=args.workers,
            seed=args.seed,
            shard_samples=args.shard_samples,
            compress_shards=args.compress_shards,
            shuffle=not args.no_shuffle,
        )
    except ValueError as exc:
        return die(str(exc).splitlines()[0])
    splits = {k: v["samples"] for k, v in manifest["splits"].items()}
    print(json.dumps({"out_dir": args.out_dir, "vocab_size": manifest["vocab_size"], **splits}))
    return 0
