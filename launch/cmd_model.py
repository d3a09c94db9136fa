"""What a trained model is used for: `translate`, `evaluate`, `export` and `average`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from launch.usage import UsageError
from trainer.run_dir import RunDir, run_dir_of_export


def resolve_export(path: Path) -> Path:
    """An export dir (ours, Transformers or CTranslate2), or a run dir whose `model/` is one."""
    from serve.formats import export_format
    from trainer.export import WEIGHTS

    for candidate in (path, RunDir(path).model):
        if export_format(candidate) is not None:
            return candidate
    model = RunDir(path).model.name
    raise UsageError(f"{path} is neither an export dir nor a run dir with {model}/{WEIGHTS}")


def load_translator(translator_cls: Any, export: Path) -> Any:
    """The export's model and tokenizer; a broken export is a UsageError, not a traceback."""
    from serve.formats import ExportError

    try:
        return translator_cls.load(export)
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    except (OSError, RuntimeError) as exc:  # e.g. a missing or damaged spm.model
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"{export} cannot be loaded: {first}") from None


def check_decode_args(args: argparse.Namespace) -> None:
    if args.beam < 1:
        raise UsageError(f"--beam must be >= 1, got {args.beam}")
    if args.nbest < 1 or args.nbest > args.beam:
        raise UsageError(f"--nbest must be in [1, --beam={args.beam}], got {args.nbest}")
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {args.max_tokens}")


def cmd_translate(args: argparse.Namespace) -> int:
    from serve.engines import AnyExport

    check_decode_args(args)
    export = resolve_export(Path(args.model))
    if args.input and not Path(args.input).is_file():
        raise UsageError(f"--input {args.input} does not exist")
    source = Path(args.input).read_text() if args.input else sys.stdin.read()
    lines = source.splitlines()
    translator = load_translator(AnyExport, export)
    print(f"paperscale: engine: {translator.engine}", file=sys.stderr)
    results = translator.translate(
        lines, beam=args.beam, lenpen=args.lenpen, nbest=args.nbest, max_tokens=args.max_tokens
    )
    rows = [
        f"{i}\t{score:.4f}\t{text}\n" if args.nbest > 1 else text + "\n"
        for i, nbest in enumerate(results)
        for text, score in nbest
    ]
    if args.output:
        Path(args.output).write_text("".join(rows))
    else:
        sys.stdout.writelines(rows)
        sys.stdout.flush()
    return 0


def damage_warning(text: Any, split: str) -> str:
    """With --allow-damaged on a damaged split: one loud line per damaged shard on stderr and
    the coverage ("251 of 500 sentences") for the score's lines; "" for a whole split."""
    if text.complete:
        return ""
    coverage = f"{len(text.sources)} of {text.expected} sentences of {split}"
    for problem in text.damaged:
        print(f"paperscale: WARNING: {problem}", file=sys.stderr)
    print(
        f"paperscale: WARNING: scoring {coverage} only (--allow-damaged); this is not the "
        f"split's score",
        file=sys.stderr,
    )
    return coverage


def cmd_evaluate(args: argparse.Namespace) -> int:
    from data_pipeline.loader import read_manifest
    from data_pipeline.text import SplitDamaged, read_split
    from launch.scoring import format_examples, pick_examples, score
    from serve.engines import AnyExport

    check_decode_args(args)
    if args.show < 0:
        raise UsageError(f"--show must be >= 0, got {args.show}")
    export = resolve_export(Path(args.model))
    data_dir = Path(args.data)
    read_manifest(data_dir)
    try:
        text = read_split(data_dir, args.split, allow_damaged=args.allow_damaged)
    except SplitDamaged as exc:
        raise UsageError(f"{exc} (--allow-damaged scores the sentences that can be read)") from None
    sources, refs = text.sources, text.targets
    coverage = damage_warning(text, args.split)
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    translator = load_translator(AnyExport, export)
    print(f"paperscale: engine: {translator.engine}", file=sys.stderr)
    hyps = [
        nbest[0][0]
        for nbest in translator.translate(
            sources, beam=args.beam, lenpen=args.lenpen, max_tokens=args.max_tokens
        )
    ]
    figures, lines = score(hyps, refs)
    result = {"split": args.split, "beam": args.beam, "lenpen": args.lenpen, **figures}
    if coverage:
        result |= {"expected_sentences": text.expected, "damaged": text.damaged}
        lines = [f"{line}  (PARTIAL: {coverage})" for line in lines]
    run = RunDir(run_dir_of_export(export))
    run.hypotheses(args.split).write_text("".join(h + "\n" for h in hyps))
    run.eval_result(args.split).write_text(json.dumps(result, indent=1))
    if args.show:
        print(format_examples(pick_examples(sources, args.show), sources, refs, hyps))
    print("\n".join(lines))
    print(json.dumps(result))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from serve.export_run import FORMAT_NAMES, default_out, export_run_as

    run_dir = Path(args.run_dir)
    run = RunDir(run_dir)
    if not run.checkpoints.root.is_dir():
        raise UsageError(f"{run_dir} is not a run dir (no {run.checkpoints.root.name}/)")
    last = getattr(args, "last", 1)
    if last < 1:
        raise UsageError(f"--last must be >= 1, got {last}")
    fmt_name = getattr(args, "format", "paperscale")
    quantization = getattr(args, "quantization", None)
    if quantization and fmt_name != "ctranslate2":
        raise UsageError("--quantization applies to --format ctranslate2 only")
    fmt, quantization = FORMAT_NAMES[fmt_name], quantization or "float32"
    if args.out:
        out = Path(args.out)
    else:
        out = default_out(run_dir, fmt, quantization) if last == 1 else run.average(last)
    try:
        tags = export_run_as(
            run_dir, out, fmt, tag=getattr(args, "tag", None), last=last, quantization=quantization
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps({"export": str(out), "checkpoints": tags, "format": fmt_name}))
    return 0
