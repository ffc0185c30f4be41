#!/usr/bin/env bash
# One GPU-machine call (every stage time-boxed, results in $OUT and packed into $OUT/results.tgz):
#   stage 1  CUDA tests: the fp8 file kept fp8, SD-Turbo on CUDA (its decoders now end in device-made pixels),
#            the round op's and the pixel tail's ops' conformance cases
#   stage 2  SD-Turbo prompt -> image, f16 (the timed dtype) and bf16 (same convolutions in the other half
#            type), DIF_CUDA_TUNE=on, each program's time by shape
#   stage 3  issue 17: klein 4B one forward bf16 / fp8-e4m3 / int8 beside diffusers eager and torch.compile;
#            klein 9B prompt -> PNG bf16 vs fp8-e4m3 with the gate over the whole schedule
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_call3_16.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: CUDA tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs dif-frontend-flux2/tests/test_fp8_files.py \
  dif-frontend-sdturbo/tests/test_backends.py "dif-backend-cuda/tests/test_conformance_cuda.py" \
  -k "not conformance or round or cast or clamp or scalar_affine or reduce_sum or transpose" \
  --junitxml=/tmp/junit3.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; tail -6 "$OUT/pytest_cuda.log"
python3 perf/junit_summary.py /tmp/junit3.xml "$OUT/cuda_tests_h200.json" --label "stop 16 call 3 CUDA tests" || true
for dt in f16 bf16; do
  stamp "stage 2: SD-Turbo $dt"
  DIF_CUDA_TUNE=on timeout 100 python3 perf/bench_sdturbo.py --device cuda --dtypes "$dt" --pipeline-dtype "$dt" \
    --iters 10 --deadline-s 90 --out-dir "$OUT/sdturbo_$dt"
  echo "sdturbo $dt rc=$?"
done
stamp "stage 3: klein 4B step"
timeout 170 python3 perf/formats_h200.py --phase step --models klein-4b --formats fp8-e4m3,int8 --compile
echo "step rc=$?"
stamp "stage 3: klein 9B pipeline gate"
LEFT=$((575 - (SECONDS - T0)))
timeout "$LEFT" python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats fp8-e4m3 --runs 3
echo "pipeline rc=$?"
stamp "done"
cp -r perf/results/formats "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
