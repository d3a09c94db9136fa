#!/usr/bin/env bash
# The big model on one GPU at the paper's batch: tokens/s, MFU and peak memory for bf16 with
# SDPA's fused attention, ZeRO 1 and 2, with and without torch.compile, on unpadded batches
# (the best case), and ZeRO 1 on WMT14-like lengths through the loader's batcher (padded,
# changing shapes). Each configuration runs in its own process (bench/gpu_bench.py), so that
# one engine's memory never counts in the next one's peak; their rows are printed at the end.
#
#   bash bench/gpu.sh                  # on a GPU machine, from the repository root (< 8 min)
#   bash bench/gpu.sh --smoke          # the same code path on CPU at tiny size (CI runs it)
#   bash bench/gpu.sh --fetch-wheels   # here, with network: wheels a bare GPU image lacks
#   bash bench/gpu.sh [--smoke] --json ROWS.json   # also the rows for bench/suite.py
#
# Python: $PYTHON, else .venv/bin/python, else python3 (a GPU image's own torch). Packages the
# image lacks (deepspeed, omegaconf, pydantic, ...) travel as wheels in .whl/ (written by
# --fetch-wheels for Python 3.12 on x86-64), installed into a temporary directory on PYTHONPATH
# when a package is missing.
set -euo pipefail

MODE=gpu
JSON=
while [[ $# -gt 0 ]]; do
    case "$1" in
        --smoke) MODE=smoke ;;
        --fetch-wheels) MODE=fetch ;;
        --json)
            if [[ $# -lt 2 ]]; then echo "bench/gpu.sh: --json needs a PATH" >&2; exit 2; fi
            JSON=$2; [[ $JSON == /* ]] || JSON="$PWD/$JSON"; shift ;;
        *) echo "bench/gpu.sh: unknown argument ${1} (use --smoke, --json PATH or --fetch-wheels)" >&2
           exit 2 ;;
    esac
    shift
done
cd "$(dirname "$0")/.."

if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch" 2>/dev/null; then
    PY=.venv/bin/python
else PY=$(command -v python3)
fi

if [[ $MODE == fetch ]]; then
    # The wheels a GPU image with torch but without this project's other needs requires.
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    DS_VERSION=$("$PY" -c "from importlib.metadata import version; print(version('deepspeed'))" \
        2>/dev/null || echo 0.19.8)
    "$PY" -m pip wheel -q --no-deps --no-build-isolation "deepspeed==$DS_VERSION" -w .whl
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl \
        hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions \
        omegaconf webdataset braceexpand
    ls -la .whl
    exit 0
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[[ $MODE == smoke ]] && export DS_ACCELERATOR=cpu

missing_packages() {  # the packages the runs need that $PY cannot import
    "$PY" - torch deepspeed omegaconf sentencepiece safetensors sacrebleu numpy webdataset \
        2>/dev/null <<'EOF' | sed -n 's/^MISSING://p'
import importlib, sys
bad = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        bad.append(name)
print("MISSING:" + " ".join(bad))
EOF
}

missing=$(missing_packages)
# the wheels only where something is missing (they are built for the GPU image's Python)
if [[ -n "$missing" ]] && [[ -d .whl ]] && ls .whl/*.whl >/dev/null 2>&1; then
    SITE=$(mktemp -d /tmp/paperscale-site.XXXXXX)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE:$PYTHONPATH"
    missing=$(missing_packages)
fi
if [[ -n "$missing" ]]; then
    echo "bench/gpu.sh: $PY lacks: $missing (run 'bash bench/gpu.sh --fetch-wheels' where pip can reach PyPI and bring .whl/ along)" >&2
    exit 2
fi

export WANDB_MODE=disabled OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
# The configurations: ZeRO stage, torch.compile, sentence lengths (fixed: the best case, no
# padding; wmt14: WMT14-like lengths through the loader's batcher), the most telling first.
CONFIGS=("1 false fixed" "1 false wmt14" "1 true fixed" "2 false fixed" "2 true fixed")
if [[ $MODE == smoke ]]; then
    DEVICE=cpu; CONFIG=configs/tiny.yaml; TOKENS=256; STEPS=2; WARMUP=1; LIMITS=(240 300); BUDGET=900
    EXTRA=(model.d_model=32 model.n_heads=2 model.d_ff=64 model.encoder_layers=1
           model.decoder_layers=1 data.vocab_size=64 train.grad_accum=1)
    # One compiled configuration: on a CPU a compile is most of the smoke's time, and
    # tests/integration/test_engine_options.py compiles the trainer's engine besides.
    CONFIGS=("1 false fixed" "1 false wmt14" "2 false fixed" "2 true fixed")
else
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "bench/gpu.sh: $PY's torch sees no CUDA device (use --smoke on a CPU)" >&2
        exit 2
    fi
    DEVICE=cuda; CONFIG=configs/big.yaml; TOKENS=25000; STEPS=20; WARMUP=5; LIMITS=(90 240); BUDGET=${GPU_BENCH_BUDGET_S:-400}
    EXTRA=(train.grad_accum=1)
fi
"$PY" -c "import torch, deepspeed; print('python', '$PY', 'torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
echo "== bench/gpu.sh ($MODE): $CONFIG, $TOKENS tokens per side per step"

OUT=$(mktemp -d /tmp/paperscale-gpu-bench.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
# One configuration after another, each with its log and rows in $OUT, none started after
# BUDGET seconds: on the GPU the script ends within 11 minutes (a first torch.compile of the big
# model took 127 s on an H200).
status=0
for i in "${!CONFIGS[@]}"; do
    read -r zero compile lengths <<< "${CONFIGS[$i]}"
    name="ZeRO $zero, compile $compile, $lengths lengths"
    if (( SECONDS > BUDGET )); then
        echo "== $name: skipped (${SECONDS}s elapsed)"; status=1; continue
    fi
    limit=${LIMITS[0]}; [[ $compile == true ]] && limit=${LIMITS[1]}
    start=$SECONDS
    if timeout "$limit" "$PY" -m bench.gpu_bench --config "$CONFIG" --device "$DEVICE" \
        --tokens "$TOKENS" --steps "$STEPS" --warmup "$WARMUP" --lengths "$lengths" \
        --json "$OUT/$i.json" "${EXTRA[@]}" train.precision=bf16 "train.zero_stage=$zero" \
        "train.compile=$compile" > "$OUT/$i.log" 2>&1; then
        echo "== $name: done in $((SECONDS - start)) s"
    else
        echo "== $name: failed (exit $?) in $((SECONDS - start)) s"
        grep -v '^\[' "$OUT/$i.log" | tail -n 20 || true
        status=1
    fi
done

shopt -s nullglob
finished=("$OUT"/*.json)
"$PY" - "$JSON" "${finished[@]}" <<'EOF'
import json, sys
from bench.__main__ import print_rows
from bench.common import write_rows

rows = [r for path in sys.argv[2:] for r in json.load(open(path))]
print_rows(rows)
write_rows(sys.argv[1] or None, rows)
EOF
if (( status )); then
    echo "bench/gpu.sh: only ${#finished[@]} of ${#CONFIGS[@]} configurations finished" >&2
fi
exit $status
