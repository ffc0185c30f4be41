#!/usr/bin/env bash
# Stop 17, GPU-machine call 4 (one call for what call 3 would have done and the embedded model; results packed
# into $OUT/results.tgz, the embedded recipe's own pack inside it as emb/results.tgz):
#   stage 1  CUDA tests: fast paths (linear_add through cuBLASLt's C input and the NVRTC fallback, convolutions
#            as one GEMM / in halves, short attention on the flash kernel), conformance cases of linear_add,
#            conv2d and sdpa, the tuning-store tests, the SD-Turbo backends test (tiny model, CUDA + OpenCL)
#   stage 2  SD-Turbo f16, DIF_CUDA_TUNE=on: the UNet beside diffusers eager, prompt -> image (KL VAE, TAESD)
#            beside StableDiffusionPipeline, with each program's graph and host times
#   stage 3  perf/h200_embedded.sh in the time left (the embedded demo model trained on CUDA, judged)
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_call4_17.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
stamp "stage 1: CUDA tests"
timeout 130 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_fast_paths_cuda.py \
  dif-backend-cuda/tests/test_choices.py dif-frontend-sdturbo/tests/test_backends.py \
  dif-backend-cuda/tests/test_conformance_cuda.py -k "not conformance or linear_add or conv2d or sdpa" \
  --junitxml=/tmp/junit4.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_cuda.log" | tail -15
python3 perf/junit_summary.py /tmp/junit4.xml "$OUT/cuda_tests_h200.json" --label "stop 17 call 4 CUDA tests" || true
stamp "stage 2: SD-Turbo f16 (tuned): UNet, prompt -> image"
DIF_CUDA_TUNE=on timeout 150 python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --pipeline-dtype f16 \
  --iters 20 --profile-iters 0 --deadline-s 140 --out-dir "$OUT/sdturbo_f16" 2>&1 | grep -v "kept in float32"
echo "sdturbo rc=$?"
TOTAL=$((${LIMIT:-575} - (SECONDS - T0)))
stamp "stage 3: the embedded model on CUDA (${TOTAL} s)"
OUT="$OUT/emb" TOTAL_S=$TOTAL VAE_S=${VAE_S:-100} JUDGE_S=${JUDGE_S:-70} bash perf/h200_embedded.sh 2>&1 \
  | tail -60
stamp "done"
cd "$OUT" && tar czf /tmp/results.tgz --exclude results.tgz --exclude run.log . && mv /tmp/results.tgz results.tgz \
  && find . -mindepth 1 ! -name results.tgz ! -name run.log -delete 2>/dev/null; ls -la "$OUT"
