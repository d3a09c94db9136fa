"""Decoding throughput of greedy and beam search, with and without the key/value cache.

Builds a small randomly initialised Transformer and translates a batch of random sources,
forcing every output to exactly --tgt-len tokens (EOS is forbidden before that step and forced
at it), so the cached and uncached runs do the same number of steps. Without the cache the
decoder recomputes the whole prefix at every step, which is quadratic in the output length;
the printed ratio is what incremental decoding buys.

With --mixed it instead times a realistic batch (cache on): 256 sentences whose source lengths
vary from 5 to 40 tokens, each output ending at its own maximum length floor(src_len + 5), so
sentences finish at different steps and the searches can drop the finished ones from the
decoder batch. It also prints the decoder rows fed over the whole search (sum over steps).

With --engines RUN_OR_EXPORT --data DATA_DIR it instead translates a split of a data dir with
a trained model through every engine: ours, Transformers (the `--format hf` export) and
CTranslate2 (fp32 and int8), the same sentences with the same beam and length penalty, and
prints sentences/s, BLEU and the share of outputs identical to ours. The exports are written to
a temporary directory.

    .venv/bin/python -m bench.decode            # d_model 256, 3+3 layers, vocab 8000
    .venv/bin/python -m bench.decode --quick    # a few seconds
    .venv/bin/python -m bench.decode --mixed --threads 1
    .venv/bin/python -m bench.decode --engines runs/synthetic --data data/synthetic --threads 1
    .venv/bin/python -m bench.decode --smoke --json rows.json   # a tiny model, seconds
    .venv/bin/python -m bench.decode --engines-smoke --json rows.json   # every engine, seconds

--json writes the sentences/s (and the cache speed-up, or the decoder rows with --mixed, or
each engine's sentences/s and BLEU with --engines) as rows for bench/suite.py.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import Row, add_output_arguments, row, write_rows
from bench.machine import describe_machine, machine_info
from data_pipeline.manifest import TOKENIZER_NAME
from model.config import EOS_ID, PAD_ID, ModelConfig
from model.search import beam_search, greedy_search
from model.transformer import Transformer
from trainer.run_dir import RunDir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; --quick shrinks the batch and the repeats, --smoke the model too."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, help="sentences per search call (16; --mixed: 256)")
    p.add_argument("--src-len", type=int, default=30, help="source tokens incl. EOS")
    p.add_argument("--min-src", type=int, default=5, help="--mixed: shortest source incl. EOS")
    p.add_argument("--max-src", type=int, default=40, help="--mixed: longest source incl. EOS")
    p.add_argument("--tgt-len", type=int, default=50, help="forced output length incl. EOS")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="timed calls per setting (best kept)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="batch 4, tgt-len 30, 1 repeat")
    p.add_argument(
        "--mixed",
        action="store_true",
        help="varied source lengths, output length limit src_len + 5, cache only",
    )
    p.add_argument("--engines", metavar="RUN_OR_EXPORT", help="a trained model: all engines")
    p.add_argument("--data", help="--engines: data dir whose split is translated")
    p.add_argument("--split", default="test", choices=["valid", "test"])
    p.add_argument("--limit", type=int, default=0, help="--engines: first N sentences (0: all)")
    p.add_argument("--lenpen", type=float, default=0.6, help="--engines: length penalty")
    p.add_argument(
        "--engines-smoke",
        action="store_true",
        help="--engines on a tiny untrained model and a few synthetic sentences (seconds)",
    )
    add_output_arguments(p, "d_model 32, 1+1 layers, vocab 200, --quick, outputs of 12 tokens")
    args = p.parse_args(argv)
    if args.engines and not args.data:
        p.error("--engines needs --data")
    if args.engines_smoke:
        args.limit = 0
    if args.batch is None:
        args.batch = 256 if args.mixed else 16
    if args.quick or args.smoke:
        args.batch, args.tgt_len, args.repeats = (32 if args.mixed else 4), 30, 1
    if args.smoke:
        args.d_model, args.heads, args.d_ff, args.layers, args.vocab = 32, 2, 64, 1, 200
        args.src_len, args.tgt_len, args.max_src = 12, 12, 12
    return args


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of `repeats` timed calls, after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def build_model(args: argparse.Namespace) -> Transformer:
    """The randomly initialised model of the benchmark, in eval mode on args.device."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=args.vocab,
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=args.d_ff,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        dropout=0.0,
    )
    return Transformer(cfg).to(args.device).eval()


def describe(model: Transformer, args: argparse.Namespace) -> str:
    """One line naming the model size, device and thread count."""
    cfg = model.cfg
    n_params = sum(p.numel() for p in model.parameters())
    return (
        f"model: d_model {cfg.d_model}, {cfg.encoder_layers}+{cfg.decoder_layers} layers, "
        f"vocab {cfg.vocab_size}, {n_params / 1e6:.1f}M params; device {args.device}, "
        f"{torch.get_num_threads()} threads"
    )


def mixed_batch(args: argparse.Namespace) -> torch.Tensor:
    """(B, max_src) sources with lengths uniform in [min_src, max_src], EOS last, PAD after."""
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(args.min_src, args.max_src + 1, (args.batch,), generator=g)
    src = torch.full((args.batch, int(lens.max())), PAD_ID, dtype=torch.long)
    for i, n in enumerate(lens.tolist()):
        src[i, : n - 1] = torch.randint(4, args.vocab, (n - 1,), generator=g)
        src[i, n - 1] = EOS_ID
    return src.to(args.device)


def count_rows(model: Transformer, fn: Callable[[], object]) -> int:
    """Decoder rows fed during one call of fn (sum over decoder calls of the batch size)."""
    fed = [0]
    decode = model.decode

    def counting(tgt_in: torch.Tensor, *rest: object, **kw: object) -> torch.Tensor:
        fed[0] += tgt_in.shape[0]
        return decode(tgt_in, *rest, **kw)  # type: ignore[arg-type]

    model.decode = counting  # type: ignore[method-assign]
    try:
        fn()
    finally:
        del model.decode
    return fed[0]


def run_mixed(model: Transformer, args: argparse.Namespace) -> list[Row]:
    """Time greedy and beam search (cache on) on a batch of varied lengths; the rows."""
    src = mixed_batch(args)
    length = dict(max_len_a=1.0, max_len_b=5)
    searches: list[tuple[str, Callable[[], object]]] = [
        ("greedy", lambda: greedy_search(model, src, **length)),
        (f"beam {args.beam}", lambda: beam_search(model, src, beam=args.beam, **length)),
    ]
    src_lens = src.ne(PAD_ID).sum(dim=1)
    print(describe(model, args))
    print(
        f"batch {args.batch} sentences, source {int(src_lens.min())}-{int(src_lens.max())} "
        f"tokens incl. EOS, max output floor(src_len + 5); cache on"
    )
    print(f"{'search':<10}{'sent/s':>10}{'seconds':>10}{'decoder rows':>14}")
    out: list[Row] = []
    with torch.inference_mode():
        for name, fn in searches:
            rows = count_rows(model, fn)
            seconds = best_time(fn, args.repeats)
            print(f"{name:<10}{args.batch / seconds:>10.2f}{seconds:>10.2f}{rows:>14}")
            case = {"search": name, "batch": args.batch}
            out.append(row(f"{name}, mixed lengths", args.batch / seconds, "sentences/s", **case))
            out.append(row(f"{name}, decoder rows fed", rows, "rows", **case))
    return out


def serving_exports(ours: Path, tmp: Path) -> list[tuple[str, Path]]:
    """Our export plus its Transformers and CTranslate2 (fp32, int8) exports under `tmp`."""
    from serve.export_ct2 import export_ct2
    from serve.export_hf import export_hf

    hf = export_hf(ours, tmp / "hf")
    return [
        ("paperscale", ours),
        ("transformers", hf),
        ("ctranslate2 fp32", export_ct2(hf, tmp / "ct2-float32", "float32")),
        ("ctranslate2 int8", export_ct2(hf, tmp / "ct2-int8", "int8")),
    ]


def run_engines(args: argparse.Namespace, ours: Path, data: Path) -> list[Row]:
    """Translate one split with each engine: sentences/s, BLEU, outputs identical to ours."""
    import sacrebleu

    from data_pipeline.text import read_split_text
    from serve.engines import AnyExport

    sources, refs = read_split_text(data, args.split)
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    print(f"machine: {describe_machine(machine_info())}, {torch.get_num_threads()} threads")
    print(
        f"{len(sources)} sentences of {data} {args.split}, beam {args.beam}, "
        f"length penalty {args.lenpen}; model {ours}"
    )
    print(f"{'engine':<18}{'sent/s':>10}{'BLEU':>8}{'same as ours':>14}")
    baseline: list[str] = []
    out: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        for name, export in serving_exports(ours, Path(tmp)):
            translator: Any = AnyExport.load(export)

            def translate(t: Any = translator) -> list[str]:
                rows = t.translate(sources, beam=args.beam, lenpen=args.lenpen)
                return [row[0][0] for row in rows]

            hyps = translate()
            seconds = best_time(translate, args.repeats)
            baseline = baseline or hyps
            same = sum(h == b for h, b in zip(hyps, baseline, strict=True)) / len(hyps)
            bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
            print(f"{name:<18}{len(sources) / seconds:>10.2f}{bleu:>8.2f}{same:>13.1%}")
            print(f"  {translator.engine}")
            case = {"engine": name, "beam": args.beam, "lenpen": args.lenpen}
            out.append(
                row(f"{name}, beam {args.beam}", len(sources) / seconds, "sentences/s", **case)
            )
            out.append(row(f"{name}, BLEU", bleu, "BLEU", **case))
            out.append(row(f"{name}, same output as ours", 100 * same, "%", **case))
    return out


def smoke_export(tmp: Path) -> tuple[Path, Path]:
    """A tiny untrained model exported with a sentencepiece model, and a data dir of a few
    synthetic pairs: what --engines needs, built in seconds."""
    from data_pipeline.corpus import write_synthetic
    from data_pipeline.prepare import prepare
    from trainer.export import write_export

    write_synthetic(tmp / "corpus", n_train=300, n_valid=8, n_test=12, seed=1)
    prepare(tmp / "corpus", tmp / "data", vocab_size=64, workers=0, log=lambda _: None)
    cfg = ModelConfig(vocab_size=64, d_model=32, n_heads=2, d_ff=64, encoder_layers=1,
                      decoder_layers=1, dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    state = {k: v.float() for k, v in Transformer(cfg).state_dict().items()}
    run = RunDir(tmp)
    write_export(run.model, state, cfg.__dict__, {}, tmp / "data" / TOKENIZER_NAME)
    return run.model, tmp / "data"


def main(argv: list[str] | None = None) -> None:
    """Time the four (search, cache) settings and print sentences/s and the cache speed-up."""
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.engines_smoke:
        args.repeats = 1
        with tempfile.TemporaryDirectory(prefix="bench-decode-smoke-") as tmp:
            ours, data = smoke_export(Path(tmp))
            write_rows(args.json, run_engines(args, ours, data))
        return
    if args.engines:
        given = Path(args.engines)
        ours = RunDir(given).model if RunDir(given).model.is_dir() else given
        write_rows(args.json, run_engines(args, ours, Path(args.data)))
        return
    model = build_model(args)
    if args.mixed:
        write_rows(args.json, run_mixed(model, args))
        return
    src = torch.randint(4, args.vocab, (args.batch, args.src_len), device=args.device)  # (B, S)
    src[:, -1] = EOS_ID
    src[1::2, args.src_len // 2 :] = PAD_ID  # half the batch is padded
    src[1::2, args.src_len // 2 - 1] = EOS_ID
    length = dict(max_len_a=0.0, max_len_b=args.tgt_len, min_len=args.tgt_len)

    def greedy(use_cache: bool) -> Callable[[], object]:
        return lambda: greedy_search(model, src, use_cache=use_cache, **length)

    def beam(use_cache: bool) -> Callable[[], object]:
        return lambda: beam_search(model, src, beam=args.beam, use_cache=use_cache, **length)

    with torch.inference_mode():
        same = greedy(True)() == greedy(False)()
        rows: list[tuple[str, float, float]] = []
        for name, make in (("greedy", greedy), (f"beam {args.beam}", beam)):
            cached = args.batch / best_time(make(True), args.repeats)
            full = args.batch / best_time(make(False), args.repeats)
            rows.append((name, cached, full))

    print(describe(model, args))
    print(
        f"batch {args.batch} sentences, source {args.src_len} (half padded to "
        f"{args.src_len // 2}), output forced to {args.tgt_len} tokens; "
        f"greedy output identical with/without cache: {same}"
    )
    print(f"{'search':<10}{'cache sent/s':>14}{'no-cache sent/s':>17}{'speed-up':>10}")
    out: list[Row] = []
    for name, cached, full in rows:
        print(f"{name:<10}{cached:>14.2f}{full:>17.2f}{cached / full:>9.1f}x")
        case = {"search": name, "batch": args.batch, "tgt_len": args.tgt_len}
        out.append(row(f"{name}, cache", cached, "sentences/s", **case))
        out.append(row(f"{name}, no cache", full, "sentences/s", **case))
        out.append(row(f"{name}, cache speed-up", cached / full, "x", **case))
    write_rows(args.json, out)


if __name__ == "__main__":
    main()
