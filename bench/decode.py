"""Decoding sentences/s (best of `repeats` timed calls) of greedy and beam 4 search.

`cache`: a random model translates 16 sources, half padded, outputs forced to `tgt_len` tokens,
with and without the key/value cache (the same steps). `mixed`: 256 sources of 5 to 40 tokens,
each output ending at its own limit, so that searches drop finished sentences; also the decoder
rows fed. `engines`: a trained model through ours, Transformers and CTranslate2 (fp32, int8):
sentences/s, test BLEU and the share of outputs identical to ours.
"""

from __future__ import annotations

import dataclasses
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from bench.common import Row, row
from data_pipeline.manifest import TOKENIZER_NAME
from model.config import EOS_ID, PAD_ID, ModelConfig
from model.search import beam_search, greedy_search
from model.transformer import Transformer
from trainer.run_dir import RunDir

BEAM = 4
SEARCHES = {"greedy": greedy_search, f"beam {BEAM}": partial(beam_search, beam=BEAM)}
FULL_MODEL = ModelConfig(
    vocab_size=8000, d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3
)
SMOKE_MODEL = ModelConfig(
    vocab_size=200, d_model=32, n_heads=2, d_ff=64, encoder_layers=1, decoder_layers=1
)


def random_model(smoke: bool) -> Transformer:
    """The bench's model, or the smoke size's (seed 0), in eval mode."""
    torch.manual_seed(0)
    return Transformer(SMOKE_MODEL if smoke else FULL_MODEL).eval()


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of `repeats` timed calls, after one untimed warm-up call."""
    fn()
    return min(timeit.repeat(fn, number=1, repeat=repeats))


def decoder_rows(model: Transformer, fn: Callable[[], object]) -> int:
    """Decoder rows fed during one call of fn (sum over decoder calls of the batch size)."""
    fed: list[int] = []
    with model.decoder.register_forward_hook(lambda _, args, __: fed.append(len(args[0]))):
        fn()
    return sum(fed)


def cache(
    smoke: bool = False, batch: int = 16, src_len: int = 30, tgt_len: int = 50, repeats: int = 3
) -> list[Row]:
    """Each search with and without the cache, outputs forced to `tgt_len` tokens."""
    model = random_model(smoke)
    src = torch.randint(4, model.cfg.vocab_size, (batch, src_len))  # (B, S)
    src[:, -1] = EOS_ID
    src[1::2, src_len // 2 :] = PAD_ID  # half the batch is padded
    src[1::2, src_len // 2 - 1] = EOS_ID
    length = dict(max_len_a=0.0, max_len_b=tgt_len, min_len=tgt_len)
    rows: list[Row] = []
    with torch.inference_mode():
        greedy = partial(greedy_search, model, src, **length)
        print(f"greedy output the same without the cache: {greedy() == greedy(use_cache=False)}")
        for name, search in SEARCHES.items():
            run = partial(search, model, src, **length)
            cached = batch / best_time(run, repeats)
            full = batch / best_time(partial(run, use_cache=False), repeats)
            case = {"search": name, "batch": batch, "tgt_len": tgt_len}
            rows += [
                row(f"{name}, cache", cached, "sentences/s", **case),
                row(f"{name}, no cache", full, "sentences/s", **case),
                row(f"{name}, cache speed-up", cached / full, "x", **case),
            ]
    return rows


def mixed(
    smoke: bool = False, batch: int = 256, min_src: int = 5, max_src: int = 40, repeats: int = 3
) -> list[Row]:
    """Each search of sources of `min_src` to `max_src` tokens, outputs up to src_len + 5."""
    model = random_model(smoke)
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(min_src, max_src + 1, (batch,), generator=g)  # (B,)
    src = torch.full((batch, int(lens.max())), PAD_ID, dtype=torch.long)  # (B, S)
    for i, n in enumerate(lens.tolist()):
        src[i, : n - 1] = torch.randint(4, model.cfg.vocab_size, (n - 1,), generator=g)
        src[i, n - 1] = EOS_ID
    rows: list[Row] = []
    with torch.inference_mode():
        for name, search in SEARCHES.items():
            run = partial(search, model, src, max_len_a=1.0, max_len_b=5)
            fed, seconds = decoder_rows(model, run), best_time(run, repeats)
            case = {"search": name, "batch": batch}
            rows += [
                row(f"{name}, mixed lengths", batch / seconds, "sentences/s", **case),
                row(f"{name}, decoder rows fed", fed, "rows", **case),
            ]
    return rows


def smoke_export(work: Path) -> Path:
    """Under `work`, a run dir holding an untrained smoke-size model's export and a data dir
    `data` of 12 synthetic test pairs."""
    from data_pipeline.corpus import write_synthetic
    from data_pipeline.prepare import prepare
    from trainer.export import write_export

    write_synthetic(work / "corpus", n_train=300, n_valid=8, n_test=12, seed=1)
    prepare(work / "corpus", work / "data", vocab_size=64, workers=0, log=lambda _: None)
    cfg = dataclasses.replace(SMOKE_MODEL, vocab_size=64, dropout=0.0)
    torch.manual_seed(0)
    state = {k: v.float() for k, v in Transformer(cfg).state_dict().items()}
    write_export(RunDir(work).model, state, cfg.__dict__, {}, work / "data" / TOKENIZER_NAME)
    return work


def engines(
    work: Path,
    model: str = "runs/demo",
    data: str = "data/debian-ende",
    smoke: bool = False,
    limit: int = 0,
    lenpen: float = 0.6,
    repeats: int = 3,
    threads: int = 1,
) -> list[Row]:
    """The first `limit` (0: all) test sentences of `data` translated by `model` (a run or an
    export) through each engine on `threads` threads (0: torch's default)."""
    import sacrebleu

    from data_pipeline.text import read_split_text
    from serve.engines import AnyExport
    from serve.export_ct2 import export_ct2
    from serve.export_hf import export_hf

    if threads:
        torch.set_num_threads(threads)
    ours, data_dir = (smoke_export(work), work / "data") if smoke else (Path(model), Path(data))
    ours = RunDir(ours).model if RunDir(ours).model.is_dir() else ours  # a run: its export
    sources, refs = read_split_text(data_dir, "test")
    sources, refs = sources[: limit or None], refs[: limit or None]
    hf = export_hf(ours, work / "hf")
    exports = {"paperscale": ours, "transformers": hf}
    for quantization, short in (("float32", "fp32"), ("int8", "int8")):
        exports[f"ctranslate2 {short}"] = export_ct2(hf, work / f"ct2-{quantization}", quantization)
    baseline: list[str] = []
    rows: list[Row] = []
    for name, export in exports.items():
        translator = AnyExport.load(export)
        print(f"{name}: {translator.engine}")
        translate = partial(translator.translate, sources, beam=BEAM, lenpen=lenpen)
        hyps = [nbest[0][0] for nbest in translate()]
        seconds = min(timeit.repeat(translate, number=1, repeat=repeats))
        baseline = baseline or hyps
        same = sum(h == b for h, b in zip(hyps, baseline, strict=True)) / len(hyps)
        case = {"engine": name, "beam": BEAM, "lenpen": lenpen}
        rows += [
            row(f"{name}, beam {BEAM}", len(sources) / seconds, "sentences/s", **case),
            row(f"{name}, BLEU", sacrebleu.corpus_bleu(hyps, [refs]).score, "BLEU", **case),
            row(f"{name}, same output as ours", 100 * same, "%", **case),
        ]
    return rows
