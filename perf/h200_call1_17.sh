#!/usr/bin/env bash
# Stop 17, GPU-machine call 1 (results in $OUT, packed into $OUT/results.tgz):
#   stage 1  CUDA tests: the fast paths (convolutions as one GEMM / in two halves, short attention on the
#            flash kernel where faster) and the SD-Turbo backends test (tiny model on CUDA and OpenCL)
#   stage 2  SD-Turbo f16, DIF_CUDA_TUNE=on: the UNet beside diffusers eager, prompt -> image (KL VAE, TAESD)
#            with each program's graph time, and the pipeline through NVIDIA OpenCL in f32 and f16 (the
#            seed's pixel bar against the CUDA image at the same dtype)
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_call1_17.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
stamp "stage 1: CUDA tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_fast_paths_cuda.py \
  dif-frontend-sdturbo/tests/test_backends.py --junitxml=/tmp/junit1.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; tail -8 "$OUT/pytest_cuda.log"
python3 perf/junit_summary.py /tmp/junit1.xml "$OUT/cuda_tests_h200.json" --label "stop 17 call 1 CUDA tests" || true
stamp "stage 2: SD-Turbo f16 (tuned) + OpenCL f32/f16"
LEFT=$((${LIMIT:-470} - (SECONDS - T0)))
DIF_CUDA_TUNE=on timeout "$LEFT" python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --pipeline-dtype f16 \
  --iters 20 --opencl --opencl-dtypes f32,f16 --deadline-s $((LEFT - 15)) --out-dir "$OUT/sdturbo_f16"
echo "sdturbo rc=$?"
stamp "done"
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
