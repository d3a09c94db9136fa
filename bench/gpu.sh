#!/usr/bin/env bash
# The big model on one GPU at the paper's batch: tokens/s, MFU and peak memory for bf16 with
# SDPA's fused attention, ZeRO 1 and 2, with and without torch.compile, on unpadded batches
# (the best case), and ZeRO 1 on WMT14-like lengths through the loader's batcher (padded,
# changing shapes); one table at the end.
#
#   bash bench/gpu.sh                  # on a GPU machine, from the repository root (< 8 min)
#   bash bench/gpu.sh --smoke          # the same code path on CPU at tiny size (CI runs it)
#   bash bench/gpu.sh --fetch-wheels   # here, with network: wheels a bare GPU image lacks
#   bash bench/gpu.sh [--smoke] --json ROWS.json   # also the figures as rows for bench/suite.py
#
# Python: $PYTHON, else .venv/bin/python, else python3 (a GPU image's own torch). Packages the
# image lacks (deepspeed, omegaconf, pydantic, ...) travel as wheels in .whl/ (written by
# --fetch-wheels for Python 3.12 on x86-64); when a package is missing and .whl/ exists, they
# are installed into a temporary directory on PYTHONPATH first. Each configuration runs in its own process, so
# that one engine's memory never counts in the next one's peak.
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

pick_python() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"
    elif [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch" 2>/dev/null; then
        echo .venv/bin/python
    else command -v python3
    fi
}
PY=$(pick_python)

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
    "$PY" - 2>/dev/null <<'EOF' | sed -n 's/^MISSING://p'
import importlib
names = ["torch", "deepspeed", "omegaconf", "sentencepiece", "safetensors", "sacrebleu", "numpy",
         "webdataset"]
bad = []
for name in names:
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
if [[ $MODE == smoke ]]; then
    export DS_ACCELERATOR=cpu
    DEVICE=cpu; CONFIG=configs/tiny.yaml; TOKENS=256; STEPS=2; WARMUP=1; LIMITS=(240 300); BUDGET=900
    EXTRA=(model.d_model=32 model.n_heads=2 model.d_ff=64 model.encoder_layers=1
           model.decoder_layers=1 data.vocab_size=64 train.grad_accum=1)
else
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "bench/gpu.sh: $PY's torch sees no CUDA device (use --smoke on a CPU)" >&2
        exit 2
    fi
    DEVICE=cuda; CONFIG=configs/big.yaml; TOKENS=25000; STEPS=20; WARMUP=5; LIMITS=(90 240); BUDGET=${GPU_BENCH_BUDGET_S:-400}
    EXTRA=(train.grad_accum=1)
fi
"$PY" -c "import torch, deepspeed; print('python', '$PY', 'torch', torch.__version__, 'deepspeed', deepspeed.__version__)"

ROWS=$(mktemp /tmp/paperscale-gpu-bench.XXXXXX.jsonl)
LOGS=$(mktemp -d /tmp/paperscale-gpu-logs.XXXXXX)
trap 'rm -rf "$ROWS" "$LOGS"' EXIT
# The configurations: ZeRO stage, torch.compile, sentence lengths (fixed: the best case, no
# padding; wmt14: WMT14-like lengths through the loader's batcher, see bench/gpu_bench.py).
# The most telling first: on the GPU a configuration past the budget is skipped.
CONFIGS=("1 false fixed" "1 false wmt14" "1 true fixed" "2 false fixed" "2 true fixed")
# At smoke size one compiled configuration: on a CPU a compile is most of the smoke's time,
# and tests/integration/test_engine_options.py compiles the trainer's engine besides.
[[ $MODE == smoke ]] && CONFIGS=("1 false fixed" "1 false wmt14" "2 false fixed" "2 true fixed")
# One configuration in its own process, its log in $LOGS; its exit status.
run_config() {
    local zero=$1 compile=$2 lengths=$3 limit=${LIMITS[0]}
    [[ $compile == true ]] && limit=${LIMITS[1]}
    timeout "$limit" "$PY" -m bench.gpu_bench --config "$CONFIG" --device "$DEVICE" \
        --tokens "$TOKENS" --steps "$STEPS" --warmup "$WARMUP" --lengths "$lengths" \
        --out "$ROWS" "${EXTRA[@]}" train.precision=bf16 "train.zero_stage=$zero" \
        "train.compile=$compile" > "$LOGS/$zero-$compile-$lengths.log" 2>&1
}
show_config() {
    echo "== ZeRO $1, compile $2, $3 lengths"
    grep -v '^\[' "$LOGS/$1-$2-$3.log" | tail -n 5 || true
}
# Configurations one after another (the arguments index CONFIGS); 1 if one failed.
run_lane() {
    local failed=0 i zero compile lengths
    for i in "$@"; do
        read -r zero compile lengths <<< "${CONFIGS[$i]}"
        run_config "$zero" "$compile" "$lengths" || failed=1
    done
    return $failed
}
status=0
if [[ $MODE == smoke ]]; then
    # On CPU each process computes on one thread: two lanes run side by side, one per core,
    # the compiled run in one, the eager ones in the other. Smoke figures are not speed figures; the table checks the code path.
    run_lane 3 & compiled=$!
    run_lane 0 1 2 & eager=$!
    wait "$compiled" || status=1
    wait "$eager" || status=1
    for config in "${CONFIGS[@]}"; do
        read -r zero compile lengths <<< "$config"
        show_config "$zero" "$compile" "$lengths"
    done
else
    # On the GPU one at a time, so that one engine's memory never counts in the next one's
    # peak; no configuration starts after BUDGET seconds: the script ends within 11 minutes
    # (a first torch.compile of the big model took 127 s on an H200).
    for config in "${CONFIGS[@]}"; do
        if (( SECONDS > BUDGET )); then
            echo "== $config: skipped (${SECONDS}s elapsed)"
            status=1
            continue
        fi
        read -r zero compile lengths <<< "$config"
        run_config "$zero" "$compile" "$lengths" || status=1
        show_config "$zero" "$compile" "$lengths"
    done
fi
echo
echo "== bench/gpu.sh ($MODE): $CONFIG, $TOKENS tokens per side per step"
"$PY" -m bench.gpu_bench --table "$ROWS" ${JSON:+--json "$JSON"}
rows=$(wc -l < "$ROWS")
if [[ $rows -ne ${#CONFIGS[@]} ]]; then
    echo "bench/gpu.sh: only $rows of ${#CONFIGS[@]} configurations finished" >&2
    exit 1
fi
exit $status
