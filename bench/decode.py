"""Decoding throughput of greedy and beam search, with and without the key/value cache.

Builds a small randomly initialised Transformer and translates a batch of random sources,
forcing every output to exactly --tgt-len tokens (EOS is forbidden before that step and forced
at it), so the cached and uncached runs do the same number of steps. Without the cache the
decoder recomputes the whole prefix at every step, which is quadratic in the output length;
the printed ratio is what incremental decoding buys.

    .venv/bin/python bench/decode.py            # d_model 256, 3+3 layers, vocab 8000
    .venv/bin/python bench/decode.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from model.config import EOS_ID, PAD_ID, ModelConfig
from model.search import beam_search, greedy_search
from model.transformer import Transformer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; --quick shrinks the batch and the repeats."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=16, help="sentences per search call")
    p.add_argument("--src-len", type=int, default=30, help="source tokens incl. EOS")
    p.add_argument("--tgt-len", type=int, default=50, help="forced output length incl. EOS")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="timed calls per setting (best kept)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="batch 4, tgt-len 30, 1 repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.tgt_len, args.repeats = 4, 30, 1
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


def main(argv: list[str] | None = None) -> None:
    """Time the four (search, cache) settings and print sentences/s and the cache speed-up."""
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
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
    model = Transformer(cfg).to(args.device).eval()
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

    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: d_model {cfg.d_model}, {cfg.encoder_layers}+{cfg.decoder_layers} layers, "
        f"vocab {cfg.vocab_size}, {n_params / 1e6:.1f}M params; device {args.device}, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"batch {args.batch} sentences, source {args.src_len} (half padded to "
        f"{args.src_len // 2}), output forced to {args.tgt_len} tokens; "
        f"greedy output identical with/without cache: {same}"
    )
    print(f"{'search':<10}{'cache sent/s':>14}{'no-cache sent/s':>17}{'speed-up':>10}")
    for name, cached, full in rows:
        print(f"{name:<10}{cached:>14.2f}{full:>17.2f}{cached / full:>9.1f}x")


if __name__ == "__main__":
    main()
