"""`paperscale`: the one command users type.

Every subcommand validates its arguments first; a bad value is one line on stderr naming it and
exit code 2, before any process group or run directory exists.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from launch.config import ConfigError

EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with the user's input, reported as one line and exit code 2."""


def _die(message: str) -> int:
    print(f"paperscale: error: {message}", file=sys.stderr)
    return EXIT_USAGE


# ---------------------------------------------------------------------------------- corpus


def cmd_corpus(args: argparse.Namespace) -> int:
    from data_pipeline.corpus import (
        CorpusUnavailable,
        fetch_debian_ende,
        fetch_wmt14_ende,
        write_synthetic,
    )

    out = Path(args.dir)
    if args.corpus_command == "synthetic":
        stats = write_synthetic(
            out, n_train=args.train, n_valid=args.valid, n_test=args.test, seed=args.seed
        )
    elif args.name == "debian-ende":
        try:
            stats = fetch_debian_ende(
                out,
                include_gettext=args.gettext,
                seed=args.seed,
                valid_size=args.valid,
                test_size=args.test,
                min_words=args.min_words,
                log=lambda msg: print(msg, file=sys.stderr, flush=True),
            )
        except CorpusUnavailable as exc:
            return _die(str(exc))
    elif args.name == "wmt14-ende":
        try:
            stats = fetch_wmt14_ende(out, log=lambda msg: print(msg, file=sys.stderr, flush=True))
        except CorpusUnavailable as exc:
            return _die(str(exc))
    else:
        return _die(f"unknown corpus {args.name!r}; known: debian-ende, wmt14-ende")
    print(json.dumps({"dir": str(out), **stats}, indent=1, default=str))
    return 0


# --------------------------------------------------------------------------------- prepare


def cmd_prepare(args: argparse.Namespace) -> int:
    from data_pipeline.prepare import prepare

    corpus = Path(args.corpus_dir)
    if not corpus.is_dir():
        return _die(f"corpus dir {corpus} does not exist")
    vocab_size = args.vocab_size
    if vocab_size is None:
        from launch.config import load_config

        vocab_size = load_config(args.config, []).data.vocab_size if args.config else 37000
    if vocab_size < 8:
        return _die(f"--vocab-size must be >= 8, got {vocab_size}")
    if args.shard_samples < 1:
        return _die(f"--shard-samples must be >= 1, got {args.shard_samples}")
    if args.workers < 1:
        return _die(f"--workers must be >= 1, got {args.workers}")
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
        )
    except ValueError as exc:
        return _die(str(exc).splitlines()[0])
    splits = {k: v["samples"] for k, v in manifest["splits"].items()}
    print(json.dumps({"out_dir": args.out_dir, "vocab_size": manifest["vocab_size"], **splits}))
    return 0


# ----------------------------------------------------------------------------------- train


def cmd_train(args: argparse.Namespace) -> int:
    import os

    from launch.config import check_data_dir, load_config, to_dict, to_yaml
    from launch.local import inside_torchrun, run_torchrun, use_cuda
    from trainer.checkpoint import write_atomic

    job = load_config(args.config, args.overrides)
    if args.run_dir:
        job.run.dir = args.run_dir
    if args.nproc < 1:
        raise ConfigError("--nproc", f"must be >= 1, got {args.nproc}")
    check_data_dir(job)
    if job.train.precision == "fp16" and not use_cuda(job.train.device):
        raise ConfigError(
            "train.precision",
            "fp16 needs a GPU (DeepSpeed's CPU accelerator refuses it); use auto or fp32",
        )
    run_dir = job.run_dir().resolve()
    job.run.dir = str(run_dir)
    if not inside_torchrun():
        from launch.preflight import check_resume

        check_resume(job, run_dir)
    is_main = os.environ.get("RANK", "0") == "0"
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / "config.yaml", to_yaml(job))
        shutil.copyfile(Path(job.data.dir) / "spm.model", run_dir / "spm.model")
    if not inside_torchrun() and args.nproc > 1:
        (run_dir / "summary.json").unlink(missing_ok=True)
        code = run_torchrun(
            args.nproc, run_dir / "config.yaml", run_dir, use_cuda(job.train.device)
        )
        return code or preempted_exit_code(run_dir)

    from trainer.loop import PrecisionError, train
    from trainer.signals import EXIT_PREEMPTED

    try:
        summary = train(job, run_dir, to_dict(job))
    except PrecisionError as exc:
        raise ConfigError("train.precision", str(exc)) from None
    if is_main:
        write_atomic(run_dir / "summary.json", json.dumps(summary, indent=1))
        print("summary: " + json.dumps(summary), flush=True)
    # Under torchrun a worker's non-zero exit makes torchrun kill the other workers, maybe
    # before they finished saving: workers exit 0 and the launcher reads summary.json.
    if summary.get("exit_code") and not inside_torchrun():
        return int(summary["exit_code"])
    if summary.get("preempted") and not inside_torchrun():
        return EXIT_PREEMPTED
    return 0


def preempted_exit_code(run_dir: Path) -> int:
    """EXIT_PREEMPTED when the workers stopped on a signal after saving, the code of a run
    that stopped on an error (non-finite loss, a checkpoint that could not be written), else
    0, as summary.json says: scripts and schedulers can tell these apart."""
    from trainer.signals import EXIT_PREEMPTED

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return 0
    if summary.get("exit_code"):
        return int(summary["exit_code"])
    return EXIT_PREEMPTED if summary.get("preempted") else 0


# ------------------------------------------------------------------------ translate / eval


def resolve_export(path: Path) -> Path:
    """An export dir, or a run dir whose `model/` is one."""
    for candidate in (path, path / "model"):
        if (candidate / "model.safetensors").is_file() and (candidate / "model.json").is_file():
            return candidate
    raise UsageError(f"{path} is neither an export dir nor a run dir with model/model.safetensors")


def load_translator(translator_cls: Any, export: Path) -> Any:
    """The export's model and tokenizer; a broken export is a UsageError, not a traceback."""
    from trainer.export import ExportError

    try:
        return translator_cls.load(export)
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    except (OSError, RuntimeError) as exc:  # e.g. a missing or damaged spm.model
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"{export} cannot be loaded: {first}") from None


def _check_decode_args(args: argparse.Namespace) -> None:
    if args.beam < 1:
        raise UsageError(f"--beam must be >= 1, got {args.beam}")
    if args.nbest < 1 or args.nbest > args.beam:
        raise UsageError(f"--nbest must be in [1, --beam={args.beam}], got {args.nbest}")
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {args.max_tokens}")


def cmd_translate(args: argparse.Namespace) -> int:
    from trainer.inference import Translator

    _check_decode_args(args)
    export = resolve_export(Path(args.model))
    if args.input and not Path(args.input).is_file():
        raise UsageError(f"--input {args.input} does not exist")
    source = Path(args.input).read_text() if args.input else sys.stdin.read()
    lines = source.splitlines()
    translator = load_translator(Translator, export)
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


def cmd_evaluate(args: argparse.Namespace) -> int:
    from data_pipeline.loader import read_manifest
    from data_pipeline.text import read_split_text
    from launch.evaluation import format_examples, pick_examples, score
    from trainer.inference import Translator

    _check_decode_args(args)
    if args.show < 0:
        raise UsageError(f"--show must be >= 0, got {args.show}")
    export = resolve_export(Path(args.model))
    data_dir = Path(args.data)
    read_manifest(data_dir)
    sources, refs = read_split_text(data_dir, args.split)
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    translator = load_translator(Translator, export)
    hyps = [
        nbest[0][0]
        for nbest in translator.translate(
            sources, beam=args.beam, lenpen=args.lenpen, max_tokens=args.max_tokens
        )
    ]
    figures, lines = score(hyps, refs)
    result = {"split": args.split, "beam": args.beam, "lenpen": args.lenpen, **figures}
    run_dir = export.parent if export.name == "model" else export
    (run_dir / f"{args.split}.hyp.txt").write_text("".join(h + "\n" for h in hyps))
    (run_dir / f"eval_{args.split}.json").write_text(json.dumps(result, indent=1))
    if args.show:
        print(format_examples(pick_examples(sources, args.show), sources, refs, hyps))
    print("\n".join(lines))
    print(json.dumps(result))
    return 0


# -------------------------------------------------------------------------- export / average


def cmd_export(args: argparse.Namespace) -> int:
    from trainer.export import export_run

    run_dir = Path(args.run_dir)
    if not (run_dir / "checkpoints").is_dir():
        raise UsageError(f"{run_dir} is not a run dir (no checkpoints/)")
    last = getattr(args, "last", 1)
    if last < 1:
        raise UsageError(f"--last must be >= 1, got {last}")
    out = Path(args.out) if args.out else run_dir / ("model" if last == 1 else f"average{last}")
    try:
        tags = export_run(run_dir, out, tag=getattr(args, "tag", None), last=last)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps({"export": str(out), "checkpoints": tags}))
    return 0


# ---------------------------------------------------------------------------------- submit


def cmd_submit(args: argparse.Namespace) -> int:
    from launch.slurm import SubmitError, submit

    try:
        return submit(args)
    except SubmitError as exc:
        return _die(str(exc))


# ---------------------------------------------------------------------------------- status


def cmd_status(args: argparse.Namespace) -> int:
    from launch.status import format_status, run_status

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run dir {run_dir} does not exist")
    status = run_status(run_dir)
    print(json.dumps(status, indent=1) if args.json else format_status(status))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from trainer.report import write_report

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise UsageError(f"{run_dir} has no metrics.jsonl")
    try:
        path, summary = write_report(run_dir, Path(args.out) if args.out else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(summary)
    print(f"report           {path}")
    return 0


# ------------------------------------------------------------------------------------ plan


def plan_gpu(args: argparse.Namespace, precision: str) -> tuple[str, str, float, float]:
    """(precision, how it was chosen, GiB per rank, peak FLOP/s per rank) for `plan`.

    `--gpu NAME` looks the GPU up in trainer/flops.py's table: its memory, its dense peak at
    the precision, and for `auto` the precision the trainer would pick on it. Without it, auto
    assumes a GPU with native bf16 and says so.
    """
    from launch.plan import H200_BF16_MEASURED
    from trainer.flops import GPU_SPECS, gpu_spec
    from trainer.precision import cuda_precision

    spec = None
    if args.gpu is not None:
        spec = gpu_spec(args.gpu)
        if spec is None:
            known = ", ".join(s.key for s in GPU_SPECS)
            raise UsageError(f"--gpu {args.gpu!r} is not in the table; known: {known}")
    if precision != "auto":
        how = "set in the config"
    elif spec is not None:
        choice = cuda_precision(spec.capability, spec.key)
        precision, how = choice.precision, f"auto: {choice.reason}"
    else:
        precision = "bf16"
        how = "auto, assumed: a GPU of compute capability >= 8.0 (pass --gpu NAME to check)"
    gpu_mem = args.gpu_mem if args.gpu_mem is not None else (spec.memory_gib if spec else 80.0)
    if args.peak_tflops is not None:
        peak = args.peak_tflops * 1e12
    elif spec is not None:
        peak = spec.half if precision in ("bf16", "fp16") else spec.single
    else:
        peak = H200_BF16_MEASURED
    return precision, how, gpu_mem, peak


def cmd_plan(args: argparse.Namespace) -> int:
    from launch.config import load_config
    from launch.plan import Machine, format_plan, make_plan
    from model.config import ModelConfig

    for name, value in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node)):
        if value < 1:
            raise UsageError(f"{name} must be >= 1, got {value}")
    for name, value in (
        ("--gpu-mem", args.gpu_mem),
        ("--target-tokens", args.target_tokens),
        ("--peak-tflops", args.peak_tflops),
        ("--seq-len", args.seq_len),
    ):
        if value is not None and not value > 0:
            raise UsageError(f"{name} must be > 0, got {value}")
    if not 0 < args.mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], got {args.mfu}")
    if not 0 <= args.headroom < 1:
        raise UsageError(f"--headroom must be in [0, 1), got {args.headroom}")
    job = load_config(args.config, args.overrides)
    precision, how, gpu_mem, peak = plan_gpu(args, job.train.precision)
    vocab = job.model.vocab_size or job.data.vocab_size
    cfg = ModelConfig(**{**job.model.__dict__, "vocab_size": vocab})
    machine = Machine(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_mem_gib=gpu_mem,
        headroom=args.headroom,
        mfu=args.mfu,
        peak_flops=peak,
    )
    plan = make_plan(
        cfg,
        machine,
        target_tokens=args.target_tokens,
        max_steps=job.train.max_steps,
        precision=precision,
        checkpointing=job.train.activation_checkpointing,
        seq_len=args.seq_len,
    )
    plan = {"vocab_size": vocab, "gpu": args.gpu, "precision_from": how, **plan}
    print(json.dumps(plan, indent=1) if args.json else format_plan(plan))
    return 0


# ---------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="paperscale",
        description="Train the Transformer of 'Attention Is All You Need' from raw parallel text "
        "to a BLEU-scored checkpoint, on local processes or Slurm, under DeepSpeed.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    corpus = sub.add_parser("corpus", help="build a parallel corpus (train/valid/test .en/.de)")
    csub = corpus.add_subparsers(dest="corpus_command", required=True, metavar="ACTION")
    fetch = csub.add_parser(
        "fetch",
        help="fetch a real corpus",
        description="debian-ende: human-translated English-German pairs from Debian's archive "
        "(Ding dictionary, translated package descriptions, optionally gettext catalogs). "
        "wmt14-ende: the paper's WMT14 task from statmt.org (Europarl v7, Common Crawl, News "
        "Commentary v9; newstest2013 valid, newstest2014 test; the options below are "
        "debian-ende's).",
    )
    fetch.add_argument("name", choices=["debian-ende", "wmt14-ende"], help="which corpus")
    fetch.add_argument("dir", help="output directory")
    fetch.add_argument("--gettext", action="store_true", help="also use installed .mo catalogs")
    fetch.add_argument("--valid", type=int, default=1000, help="validation pairs (default 1000)")
    fetch.add_argument("--test", type=int, default=1000, help="test pairs (default 1000)")
    fetch.add_argument("--min-words", type=int, default=3, help="shortest side kept (default 3)")
    fetch.add_argument("--seed", type=int, default=1)
    fetch.set_defaults(func=cmd_corpus)
    synth = csub.add_parser(
        "synthetic",
        help="a deterministic synthetic corpus (mapped reversal) for tests and offline machines",
    )
    synth.add_argument("dir", help="output directory")
    synth.add_argument("--train", type=int, default=20000)
    synth.add_argument("--valid", type=int, default=500)
    synth.add_argument("--test", type=int, default=500)
    synth.add_argument("--seed", type=int, default=1)
    synth.set_defaults(func=cmd_corpus)

    prep = sub.add_parser(
        "prepare",
        help="train sentencepiece, encode, write webdataset shards + manifest.json",
        description="Reads CORPUS_DIR/{train,valid,test}.{SRC,TGT} (plain or .gz) and writes "
        "OUT_DIR/spm.model, OUT_DIR/shards/*.tar and OUT_DIR/manifest.json.",
    )
    prep.add_argument("corpus_dir")
    prep.add_argument("out_dir")
    prep.add_argument(
        "--config", help="take the vocabulary size from this config's data.vocab_size"
    )
    prep.add_argument("--vocab-size", type=int, help="sentencepiece pieces (default 37000)")
    prep.add_argument("--src", default="en")
    prep.add_argument("--tgt", default="de")
    prep.add_argument("--workers", type=int, default=2, help="encoding processes (default 2)")
    prep.add_argument(
        "--shard-samples", type=int, default=100_000, help="pairs per shard (default 100000)"
    )
    prep.add_argument(
        "--compress-shards",
        action="store_true",
        help="write .tar.gz shards (about 20x smaller for short sentences)",
    )
    prep.add_argument("--seed", type=int, default=1)
    prep.set_defaults(func=cmd_prepare)

    train = sub.add_parser(
        "train",
        help="train (or resume) a model",
        description="Train from a config preset with key=value overrides. Resumes from the run "
        "dir's latest complete checkpoint when there is one.",
    )
    train.add_argument("--config", required=True, help="YAML preset, e.g. configs/tiny.yaml")
    train.add_argument("--nproc", type=int, default=1, help="local processes (through torchrun)")
    train.add_argument("--run-dir", help="run directory (default runs/<run.name>)")
    train.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. optim.lr=5e-4")
    train.set_defaults(func=cmd_train)

    for name, helptext in (
        ("translate", "translate lines from stdin or --input; detokenised text to stdout"),
        ("evaluate", "translate a split of a data dir and report sacreBLEU and chrF"),
    ):
        sp = sub.add_parser(name, help=helptext, description=helptext)
        sp.add_argument("model", help="a run dir (uses RUN/model) or an export dir")
        sp.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy; default 4)")
        sp.add_argument("--lenpen", type=float, default=0.6, help="length penalty alpha (0.6)")
        sp.add_argument("--max-tokens", type=int, default=4096, help="source tokens per batch")
        if name == "translate":
            sp.add_argument("--nbest", type=int, default=1, help="hypotheses per line")
            sp.add_argument("--input", help="input file (default stdin)")
            sp.add_argument("--output", help="output file (default stdout)")
            sp.set_defaults(func=cmd_translate)
        else:
            sp.add_argument("--data", required=True, help="data dir written by `prepare`")
            sp.add_argument("--split", default="test", choices=["valid", "test"])
            sp.add_argument("--limit", type=int, default=0, help="first N sentences only")
            sp.add_argument(
                "--show",
                type=int,
                default=0,
                help="print N sentences: source, reference, hypothesis (default 0)",
            )
            sp.set_defaults(func=cmd_evaluate, nbest=1)

    export = sub.add_parser(
        "export",
        help="one consolidated fp32 safetensors file from a checkpoint of any ZeRO stage",
        description="Writes model.safetensors, model.json, config.yaml and spm.model into "
        "--out (default RUN/model) from the latest (or --tag) checkpoint.",
    )
    export.add_argument("run_dir")
    export.add_argument("--tag", help="checkpoint tag, e.g. step_00001000 (default: latest)")
    export.add_argument("--out", help="output dir (default RUN/model)")
    export.set_defaults(func=cmd_export)
    average = sub.add_parser(
        "average",
        help="average the last K checkpoints into one export (the paper: 5 base, 20 big)",
        description="Averages the fp32 weights of the last K complete checkpoints and writes "
        "them like `export` (default RUN/averageK).",
    )
    average.add_argument("run_dir")
    average.add_argument("--last", type=int, required=True, help="how many checkpoints")
    average.add_argument("--out", help="output dir (default RUN/averageK)")
    average.set_defaults(func=cmd_export)

    submit = sub.add_parser(
        "submit",
        help="train on a Slurm cluster: write RUN/job.sbatch and the config, sbatch it",
        description="Validates the config like `train`, writes RUN/config.yaml and the sbatch "
        "script RUN/job.sbatch (one srun task per node, each a torchrun with a c10d rendezvous "
        "on the first node), submits it and prints the job id. Before the time limit the job "
        "saves a checkpoint and requeues itself; the requeued job resumes in the same run dir.",
    )
    submit.add_argument("--config", required=True, help="YAML preset, e.g. configs/base.yaml")
    submit.add_argument(
        "--cluster", help="profile name in configs/clusters/ (e.g. local) or a YAML path"
    )
    submit.add_argument("--nodes", type=int, help="nodes (default: the profile's)")
    submit.add_argument("--gpus-per-node", type=int, help="GPUs per node (0: CPU ranks)")
    submit.add_argument("--nproc-per-node", type=int, help="ranks per node (default: GPUs or 1)")
    submit.add_argument("--time", help="time limit, e.g. 2-00:00:00")
    for option in ("--partition", "--account", "--qos", "--constraint"):
        submit.add_argument(option)
    submit.add_argument("--run-dir", help="run directory (default runs/<run.name>)")
    submit.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    submit.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. optim.lr=5e-4")
    submit.set_defaults(func=cmd_submit)

    status = sub.add_parser(
        "status", help="last step, checkpoint, tokens/s, losses and BLEU of a run"
    )
    status.add_argument("run_dir")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    report = sub.add_parser("report", help="plot RUN/report.png and print a short summary")
    report.add_argument("run_dir")
    report.add_argument("--out", help="PNG path (default RUN/report.png)")
    report.set_defaults(func=cmd_report)

    plan = sub.add_parser(
        "plan",
        help="memory per rank per ZeRO stage, micro-batch x accumulation, time per step",
        description="Before any GPU is spent: per-rank memory of parameters, gradients, "
        "optimizer states and DeepSpeed buffers for ZeRO 0-3, activations, the largest "
        "micro-batch that fits, the accumulation reaching --target-tokens (per side) per "
        "step, FLOPs and time at an assumed MFU, and the recommended stage.",
    )
    plan.add_argument("--config", required=True)
    plan.add_argument("--nodes", type=int, default=1)
    plan.add_argument("--gpus-per-node", type=int, default=8)
    plan.add_argument(
        "--gpu",
        help="the GPU model (e.g. h200, a100, v100, t4): its memory and peak from the table in "
        "trainer/flops.py, and the precision train.precision=auto picks on it",
    )
    plan.add_argument(
        "--gpu-mem", type=float, help="GiB per rank (default: --gpu's memory, else 80)"
    )
    plan.add_argument(
        "--target-tokens", type=int, default=25000, help="tokens per side per step (25000)"
    )
    plan.add_argument("--mfu", type=float, default=0.4, help="assumed MFU (default 0.4)")
    plan.add_argument(
        "--peak-tflops",
        type=float,
        help="peak dense TFLOP/s per rank (default: --gpu's datasheet figure at the precision, "
        "else 790, an H200's measured bf16 matmul rate; on a CPU pass the matmul rate "
        "trainer.flops.measured_cpu_peak_flops reports)",
    )
    plan.add_argument(
        "--headroom", type=float, default=0.1, help="fraction of --gpu-mem left free (0.1)"
    )
    plan.add_argument(
        "--seq-len", type=int, default=32, help="mean padded sentence length for FLOPs (32)"
    )
    plan.add_argument("--json", action="store_true")
    plan.add_argument("overrides", nargs="*", metavar="key=value")
    plan.set_defaults(func=cmd_plan)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, UsageError) as exc:
        return _die(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
