#!/usr/bin/env bash
# Every GPU check of the project in one call, for a GPU machine (< 10 min on one H200):
#   1. the CUDA tests (tests/gpu: the step's synchronisations, CUDA's attention kernels against
#      math, a profiled run with background saves resumed to the sample);
#   2. the SDPA kernels side by side at the big model's shapes (bench `attention_gpu`);
#   3. bench `gpu`'s figures (tokens/s, MFU, memory of the big model; bench/gpu.py).
#
#   bash tests/gpu/checks.sh [OUT_DIR]       # from the repository root; logs and rows in OUT_DIR
#   bash tests/gpu/checks.sh --fetch-wheels  # here, where pip reaches PyPI: the wheels below
#
# Python: $PYTHON, else .venv/bin/python, else python3 (a GPU image's own torch). Packages the
# image lacks (deepspeed, omegaconf, pydantic, ...) travel as wheels in .whl/, written by
# --fetch-wheels for Python 3.12 on x86-64. Exit status: 1 if a part failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch" 2>/dev/null; then
    PY=.venv/bin/python
else PY=python3
fi
if [[ "${1:-}" == --fetch-wheels ]]; then
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    DS_VERSION=$("$PY" -c "from importlib.metadata import version; print(version('deepspeed'))")
    "$PY" -m pip wheel -q --no-deps --no-build-isolation "deepspeed==$DS_VERSION" -w .whl
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl hjson pydantic pydantic-core annotated-types \
        typing-inspection typing-extensions omegaconf webdataset braceexpand
    ls -la .whl
    exit 0
fi
OUT_DIR=${1:-/tmp/paperscale-gpu-checks}
mkdir -p "$OUT_DIR"
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
# bench/RESULTS.md on the machine the repository lives on. The `gpu` bench starts no
# configuration after its budget: what is left of 9.5 minutes in all.
export GPU_BENCH_BUDGET_S=$((570 - 240 - 30 - SECONDS))
part benches 600 "$PY" -m bench.suite --only attention_gpu,gpu --verbose \
    --json "$OUT_DIR/report.json" --results "$OUT_DIR/RESULTS.md" --work-dir "$OUT_DIR/work"
exit $status
