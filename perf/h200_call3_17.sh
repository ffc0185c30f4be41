#!/usr/bin/env bash
# Stop 17, GPU-machine call 3 (results in $OUT, packed into $OUT/results.tgz):
#   stage 1  CUDA tests: fast paths (linear_add through cuBLASLt's C input and the NVRTC fallback, convolutions
#            as one GEMM / in halves, short attention on the flash kernel), the conformance cases of linear_add,
#            conv2d and sdpa, the tuning-store tests, the SD-Turbo backends test (tiny model, CUDA + OpenCL)
#   stage 2  SD-Turbo f16, DIF_CUDA_TUNE=on, in one run: the UNet beside diffusers eager and torch.compile,
#            prompt -> image (KL VAE, TAESD) with graph and host times (OpenCL: call 1)
#   stage 3  (when LIMIT leaves 90 s) klein-9B LoRA training step 1024^2, dif vs torch+peft, profiled
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_call3_17.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
stamp "stage 1: CUDA tests"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_fast_paths_cuda.py \
  dif-backend-cuda/tests/test_choices.py dif-frontend-sdturbo/tests/test_backends.py \
  "dif-backend-cuda/tests/test_conformance_cuda.py" -k "not conformance or linear_add or conv2d or sdpa" \
  --junitxml=/tmp/junit3.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; tail -12 "$OUT/pytest_cuda.log"
python3 perf/junit_summary.py /tmp/junit3.xml "$OUT/cuda_tests_h200.json" --label "stop 17 call 3 CUDA tests" || true
stamp "stage 2: SD-Turbo f16 (tuned): UNet + compile, pipeline, OpenCL f32/f16"
DIF_CUDA_TUNE=on timeout 330 python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --pipeline-dtype f16 \
  --compile --iters 20 --deadline-s 320 --out-dir "$OUT/sdturbo_f16"
echo "sdturbo rc=$?"
LEFT=$((${LIMIT:-280} - (SECONDS - T0)))
stamp "stage 3: klein-9B LoRA step, profiled ($LEFT s left)"
[ "$LEFT" -gt 90 ] && timeout "$LEFT" python3 perf/train_lora_step.py --iters 3 --warm 1 --no-checkpoint-variant \
  --profile 40 --out-dir "$OUT" 2>&1 | tail -8
stamp "done"
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
