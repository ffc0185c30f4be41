#!/usr/bin/env bash
# One GPU-machine call: the CUDA backend's tests (fused ops of dif.passes included), then FLUX.2 klein 9B and
# 4B through perf/bench_denoiser.py (diffusers eager, torch.compile, dif with its optimizer passes).
# Device call (repo root, carry [".whl"]):  set -o pipefail; bash perf/h200_fused.sh 2>&1 | tee $OUT/run.log
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
T0=$SECONDS
stamp() { echo "== $((SECONDS - T0)) s: $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
SRC=dif-core/src:dif-backend-cpu/src:dif-backend-cuda/src:dif-frontend-flux2/src:dif-frontend-krea2/src
export PYTHONPATH=/tmp/site:$PWD/${SRC//:/:$PWD/}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader

stamp "stage 1: CUDA backend tests (commit $COMMIT)"
timeout 170 python3 -m pytest -q -p no:cacheprovider dif-backend-cuda/tests --junitxml=/tmp/cuda_junit.xml \
  >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"
tail -4 "$OUT/pytest_cuda.log"
python3 perf/junit_summary.py /tmp/cuda_junit.xml "$OUT/cuda_conformance_h200.json" \
  --label "pytest dif-backend-cuda/tests on the H200 (with fused ops)" --meta "commit=$COMMIT"

stamp "stage 2: FLUX.2 klein 9B and 4B vs diffusers eager / torch.compile"
timeout 330 python3 perf/bench_denoiser.py --models klein-9b,klein-4b --compile --iters 10 --budget-s 15 \
  --out-dir "$OUT"
echo "bench rc=$?"
stamp "done"
