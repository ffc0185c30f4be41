#!/usr/bin/env bash
# One GPU-machine call for the library ceilings of the klein shapes (perf/probe_attention_gemm.py), the CUDA
# backend tests, and dif's klein-9B forward timed by op and by shape (no torch.compile), with the GPU's SM clock
# and power sampled during it. Results under $OUT. Environment: PARTS (probe parts; empty: none), TESTS=0 (skip the
# tests), MODELS, BENCH_ARGS (more bench_denoiser.py options, e.g. "--pipeline --pipeline-models klein-4b").
# Device call (repo root, carry [".whl"]):  bash perf/h200_probe.sh 2>&1 | tee $OUT/probe.log | tail -60
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
SRC=dif-core/src:dif-backend-cpu/src:dif-backend-cuda/src:dif-frontend-flux2/src:dif-frontend-krea2/src:dif-tools/src
export PYTHONPATH=/tmp/site:$PWD/${SRC//:/:$PWD/}
PARTS=${PARTS-sustained,sdpa_sustained}  # PARTS= (empty): no probe
if [ -n "$PARTS" ]; then
  timeout 200 python3 perf/probe_attention_gemm.py --parts "$PARTS" --out "$OUT/probe.json"
  echo "probe rc=$?"
fi
if [ "${TESTS:-1}" = 1 ]; then
  timeout 170 python3 -m pytest -q -p no:cacheprovider dif-backend-cuda/tests >"$OUT/pytest_cuda.log" 2>&1
  echo "pytest rc=$?"; tail -3 "$OUT/pytest_cuda.log"
fi
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 >"$OUT/clocks.csv" &
SMI=$!
timeout 240 python3 perf/bench_denoiser.py --models "${MODELS:-klein-9b}" --iters 10 --budget-s 10 --profile-iters 3 \
  --profile-max-s 5 --out-dir "$OUT" ${BENCH_ARGS:-}
echo "bench rc=$?"
kill $SMI
