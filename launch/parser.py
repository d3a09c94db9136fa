"""The `paperscale` argument parser: one function per subcommand."""

from __future__ import annotations

import argparse

from launch.cmd_calibrate import cmd_calibrate
from launch.cmd_data import cmd_corpus, cmd_prepare
from launch.cmd_info import cmd_config, cmd_report, cmd_status
from launch.cmd_model import cmd_evaluate, cmd_export, cmd_translate
from launch.cmd_plan import cmd_plan
from launch.cmd_train import cmd_submit, cmd_train
from serve.formats import QUANTIZATIONS

Subparsers = argparse._SubParsersAction  # the object add_subparsers returns


def add_corpus(sub: Subparsers) -> None:
    """`corpus fetch NAME DIR` and `corpus synthetic DIR`."""
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
    fetch.add_argument(
        "--train-order",
        choices=["shuffled", "source"],
        default="shuffled",
        help="training pairs in a seeded random order (default), or grouped by source as a "
        "corpus concatenated from its parts comes (what `prepare` must cope with)",
    )
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
    synth.add_argument("--min-len", type=int, default=5, help="fewest words in a sentence")
    synth.add_argument("--max-len", type=int, default=20, help="most words in a sentence")
    synth.set_defaults(func=cmd_corpus)


def add_prepare(sub: Subparsers) -> None:
    """`prepare CORPUS_DIR OUT_DIR`."""
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
    prep.add_argument(
        "--no-shuffle",
        action="store_true",
        help="keep the training pairs in input order (default: a seeded global shuffle)",
    )
    prep.add_argument("--seed", type=int, default=1, help="tokenizer and shuffle seed")
    prep.set_defaults(func=cmd_prepare)


def add_train(sub: Subparsers) -> None:
    """`train --config FILE [--nproc N] [key=value ...]`."""
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


def add_decode(sub: Subparsers) -> None:
    """`translate` and `evaluate`: the decoding options they share."""
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
                "--allow-damaged",
                action="store_true",
                help="score what a damaged split still holds, saying so (default: refuse)",
            )
            sp.add_argument(
                "--show",
                type=int,
                default=0,
                help="print N sentences: source, reference, hypothesis (default 0)",
            )
            sp.set_defaults(func=cmd_evaluate, nbest=1)


def add_export(sub: Subparsers) -> None:
    """`export` and `average`."""
    export = sub.add_parser(
        "export",
        help="one consolidated fp32 safetensors file from a checkpoint of any ZeRO stage",
        description="Writes model.safetensors, model.json, config.yaml and spm.model into "
        "--out (default RUN/model) from the latest (or --tag) checkpoint.",
    )
    export.add_argument("run_dir")
    export.add_argument("--tag", help="checkpoint tag, e.g. step_00001000 (default: latest)")
    export.add_argument("--out", help="output dir (default RUN/model, RUN/hf, RUN/ct2-<quant>)")
    export.add_argument(
        "--format",
        default="paperscale",
        choices=["paperscale", "hf", "ctranslate2"],
        help="ours (default), a Transformers MarianMTModel, or CTranslate2 (serve extra)",
    )
    export.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        help="--format ctranslate2: weight type (default float32)",
    )
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


def add_submit(sub: Subparsers) -> None:
    """`submit`: the training as a Slurm job."""
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


def add_status(sub: Subparsers) -> None:
    """`status RUN`."""
    status = sub.add_parser(
        "status", help="last step, checkpoint, tokens/s, losses and BLEU of a run"
    )
    status.add_argument("run_dir")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)


def add_report(sub: Subparsers) -> None:
    """`report RUN`."""
    report = sub.add_parser("report", help="plot RUN/report.png and print a short summary")
    report.add_argument("run_dir")
    report.add_argument("--out", help="PNG path (default RUN/report.png)")
    report.set_defaults(func=cmd_report)


def add_plan(sub: Subparsers) -> None:
    """`plan`: memory, batch and time before any GPU is spent."""
    plan = sub.add_parser(
        "plan",
        help="memory per rank per ZeRO stage, micro-batch x accumulation, time per step and "
        "to a BLEU",
        description="Before any GPU is spent: per-rank memory of parameters, gradients, "
        "optimizer states and DeepSpeed buffers for ZeRO 0-3, activations, the largest "
        "micro-batch that fits, the accumulation reaching --target-tokens (per side) per "
        "step (by default the config's own), FLOPs, the step time (measured with "
        "--calibration, else assumed), what the run spends beside its steps (start-up, "
        "evaluations, saves), the time to a published (or measured) run's BLEU, the last step "
        "of a time budget, and the recommended stage. Every time line prices one batch (the "
        "config's own where it is the recommended one) and says which.",
    )
    plan.add_argument("--config", required=True)
    plan.add_argument("--nodes", type=int, default=1)
    plan.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (8)")
    plan.add_argument(
        "--gpu",
        help="the GPU model (e.g. h200, a100, v100, t4): its memory and peak from the table in "
        "trainer/flops.py, and the precision train.precision=auto picks on it",
    )
    plan.add_argument(
        "--gpu-mem",
        type=float,
        help="GiB per rank (default: --gpu's memory, else the calibration's, else 80)",
    )
    plan.add_argument(
        "--target-tokens",
        default="config",
        help="tokens per side per step: 'config' (default) for the config's own "
        "data.max_tokens x train.grad_accum x ranks, or a number (25000: the paper's)",
    )
    plan.add_argument(
        "--batch-tolerance",
        type=float,
        default=0.1,
        help="how far a step of the largest micro-batches may land from the target (0.1)",
    )
    add_plan_speed(plan)
    plan.add_argument("--json", action="store_true")
    plan.add_argument("overrides", nargs="*", metavar="key=value")
    plan.set_defaults(func=cmd_plan)


def add_calibrate(sub: Subparsers) -> None:
    """`calibrate --config FILE [--out FILE]`: this machine's speed for `plan --calibration`."""
    cal = sub.add_parser(
        "calibrate",
        help="measure one rank's training speed here, for `plan --calibration`",
        description="Steps the trainer's own engine on the config's model in one process (a "
        "world of one) at several micro-batch sizes and once with two micro-batches, fits the "
        "plan's step model (overhead per step + per micro-batch + tokens / rate), times the "
        "config's own batch as a check, times the engine's build, and where data.dir holds "
        "prepared data the trainer's validation pass and decodes of its sentences; writes the "
        "file `plan --calibration` reads. Run it with the threads a rank gets "
        "(OMP_NUM_THREADS=1 for CPU ranks).",
    )
    cal.add_argument("--config", required=True, help="YAML preset, e.g. configs/tiny.yaml")
    cal.add_argument("--out", help="the calibration file to write (default: print only)")
    cal.add_argument(
        "--tokens",
        help="comma-separated micro-batch sizes to fit (default: the config's data.max_tokens "
        "/ 2, x 1, x 2)",
    )
    cal.add_argument("--steps", type=int, default=5, help="timed steps per point (5)")
    cal.add_argument("--seq-len", type=int, default=32, help="tokens per sentence (32)")
    cal.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    cal.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="CPU: time rank 0 of N local ranks in one world (torchrun started here), as a "
        "run's N ranks step: the gradients' synchronisation and the shared cores, caches and "
        "memory in, each rank's share of the evaluations (1: a world of one)",
    )
    cal.add_argument(
        "--clock",
        choices=["auto", "wall", "cpu"],
        default="auto",
        help="a step's time: wall seconds, or this process's CPU seconds (auto: CPU seconds on "
        "a one-thread CPU rank, which other processes on the machine do not inflate)",
    )
    cal.add_argument("overrides", nargs="*", metavar="key=value")
    cal.set_defaults(func=cmd_calibrate)


def add_plan_speed(plan: argparse.ArgumentParser) -> None:
    """`plan`'s step time, time to BLEU and save time: measured or assumed figures."""
    plan.add_argument(
        "--calibration",
        metavar="FILE",
        help="this machine's measured speed (`paperscale calibrate --out FILE` writes it)",
    )
    plan.add_argument(
        "--mfu",
        type=float,
        help="assumed MFU (0.4 where nothing measured applies: fp16, or with --overhead-ms); "
        "without it a bf16 GPU is planned from the measured H200 by the ratio of peaks",
    )
    plan.add_argument(
        "--peak-tflops",
        type=float,
        help="peak dense TFLOP/s per rank of a device not measured (default: --gpu's datasheet "
        "figure at the precision, else 790, an H200's measured bf16 matmul rate)",
    )
    plan.add_argument(
        "--overhead-ms",
        type=float,
        help="assumed overhead per step of a device not measured, in ms (8)",
    )
    plan.add_argument(
        "--fill",
        type=float,
        default=1.0,
        help="share of data.max_tokens the batcher fills per micro-batch, for the step time (1)",
    )
    plan.add_argument("--anchor", help="the published run the time to BLEU is taken from")
    plan.add_argument(
        "--headroom", type=float, default=0.1, help="fraction of --gpu-mem left free (0.1)"
    )
    plan.add_argument(
        "--seq-len", type=int, default=32, help="mean padded sentence length for FLOPs (32)"
    )
    plan.add_argument(
        "--write-gbs",
        type=float,
        default=1.0,
        help="GB/s a node writes checkpoints at (assumed; default 1.0): the save time",
    )
    plan.add_argument(
        "--intra-link",
        choices=["nvlink", "pcie"],
        default="nvlink",
        help="how a node's GPUs reach each other, for the gradients' synchronisation (nvlink)",
    )
    plan.add_argument(
        "--network",
        choices=["ib", "ethernet"],
        default="ib",
        help="the nodes' network beyond one node (ib: 8 x 400 Gb/s a node; ethernet: 100 Gb/s)",
    )
    plan.add_argument(
        "--network-gbps",
        type=float,
        help="a node's network in Gb/s, all its adapters (e.g. 3200), instead of --network's",
    )


def add_config(sub: Subparsers) -> None:
    """`config`: the resolved config a run would use, or the reference of every key."""
    config = sub.add_parser(
        "config",
        help="print the resolved config a run would use (YAML), or --reference: every key",
        description="Print the config `train` would use for --config and the overrides "
        "(defaults <- preset <- key=value), as YAML; with --reference, the Markdown reference "
        "of every key (docs/configuration.md).",
    )
    config.add_argument("--config", help="a preset YAML (default: the schema's defaults)")
    config.add_argument("--reference", action="store_true", help="every key, its default, etc.")
    config.add_argument("overrides", nargs="*", help="key=value overrides")
    config.set_defaults(func=cmd_config)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="paperscale",
        description="Train the Transformer of 'Attention Is All You Need' from raw parallel text "
        "to a BLEU-scored checkpoint, on local processes or Slurm, under DeepSpeed.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        add_corpus, add_prepare, add_train, add_decode, add_export, add_submit, add_status,
        add_report, add_plan, add_calibrate, add_config,
    ):  # fmt: skip
        add(sub)
    return p
