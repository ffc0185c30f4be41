#!/usr/bin/env bash
# The last GPU-machine call of stop 16 (results in $OUT, packed into $OUT/results.tgz):
#   stage 1  CUDA tests: the fast paths (masked SDPA over the attended keys, convolutions in two halves)
#   stage 2  SD-Turbo prompt -> image f16, DIF_CUDA_TUNE=on (the first run times whole vs two-half convolutions)
#   stage 3  Krea 2 one forward bf16 / fp8-e4m3 beside diffusers eager (formats_h200.py --phase step)
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_call5_16.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: CUDA tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_fast_paths_cuda.py \
  ${EXTRA_TESTS:-} --junitxml=/tmp/junit5.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; tail -6 "$OUT/pytest_cuda.log"
python3 perf/junit_summary.py /tmp/junit5.xml "$OUT/cuda_tests_h200.json" --label "stop 16 call 5 CUDA tests" || true
stamp "stage 2: SD-Turbo f16"
DIF_CUDA_TUNE=on timeout 110 python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --pipeline-dtype f16 \
  --iters 20 --deadline-s 100 --out-dir "$OUT/sdturbo_f16"
echo "sdturbo rc=$?"
stamp "stage 3: Krea 2 formats step"
LEFT=$((${LIMIT:-480} - (SECONDS - T0)))
timeout "$LEFT" python3 perf/formats_h200.py --phase step --models krea2 --formats fp8-e4m3
echo "krea2 rc=$?"
stamp "done"
cp -r perf/results/formats "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
