#!/usr/bin/env bash
# Every GPU check of the project in one call, for a GPU machine (< 10 min on one H200):
#   1. the CUDA tests (tests/gpu: the step's synchronisations, CUDA's attention kernels against
#      math, a profiled run with background saves resumed to the sample);
#   2. the SDPA kernels side by side at the big model's shapes (bench `attention_gpu`);
#   3. bench/gpu.sh's figures (tokens/s, MFU, memory of the big model; bench `gpu`).
#
#   bash tests/gpu/checks.sh [OUT_DIR]     # from the repository root; logs and rows in OUT_DIR
#
# Python as bench/gpu.sh picks it; packages a GPU image lacks travel as wheels in .whl/
# (`bash bench/gpu.sh --fetch-wheels` where pip reaches PyPI). Exit status: 1 if a part failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:-/tmp/paperscale-gpu-checks}
mkdir -p "$OUT_DIR"
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
else PY=python3
fi
if [[ -d .whl ]] && ls .whl/*.whl >/dev/null 2>&1; then
    SITE=$(mktemp -d /tmp/paperscale-site.XXXXXX)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=disabled
unset DS_ACCELERATOR
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT_DIR/machine.txt" 2>&1
"$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda)" >> "$OUT_DIR/machine.txt" 2>&1
cat "$OUT_DIR/machine.txt"
status=0
part() {  # part NAME LIMIT_S COMMAND...: one part, its log in OUT_DIR/NAME.log
    local name=$1 limit=$2 rc start=$SECONDS
    shift 2
    timeout "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc in $((SECONDS - start)) s"
    tail -n 25 "$OUT_DIR/$name.log"
    [[ $rc -eq 0 ]] || status=1
}
part tests 240 "$PY" -m pytest -q -ra -s -p no:cacheprovider -m gpu tests/gpu
# The GPU benches through the suite: their tables (command, this machine, date) in
# OUT_DIR/report.json, which `python -m bench.suite --import OUT_DIR/report.json` writes into
# bench/RESULTS.md on the machine the repository lives on. bench/gpu.sh starts no
# configuration after its budget: what is left of 9.5 minutes in all.
export GPU_BENCH_BUDGET_S=$((570 - 240 - 30 - SECONDS))
part benches 600 "$PY" -m bench.suite --only attention_gpu,gpu --verbose \
    --json "$OUT_DIR/report.json" --results "$OUT_DIR/RESULTS.md" --work-dir "$OUT_DIR/work"
exit $status
