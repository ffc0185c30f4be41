#!/usr/bin/env bash
# Stop 24, GPU-machine call 1 (results in $OUT):
#   stage 1  perf/opencl_int4.py on NVIDIA OpenCL (issue 17: int4 groups against bf16 on a GPU), alone on the GPU
#   stage 2  in the background, the GPU tests never run on one: CUDA's int4_linear (group 32 included) and the
#            GGUF Q4_0 run kept 4-bit on CUDA, OpenCL's int4 GEMM on NVIDIA OpenCL, torch-cuda seeds
#   stage 3  perf/h200_embedded.sh in front: the embedded default's transformer trained on from the installed
#            weights (issue 16), its settings from the environment (BATCH, LR, SAMPLER_SHARE, PER_COMBO, TOTAL_S)
# Device call (repo root, carry [".whl"]):
#   set -o pipefail; bash perf/h200_call1_24.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
stamp "stage 1: int4 on NVIDIA OpenCL"
timeout 90 python3 perf/opencl_int4.py --device NVIDIA --out "$OUT/opencl_int4_nvidia.json" 2>&1 | tail -12
echo "opencl_int4 rc=${PIPESTATUS[0]}"

stamp "stage 2: GPU tests (background)"
(timeout 400 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests dif-backend-opencl/tests/test_quant_opencl.py \
  dif-frontend-flux2/tests/test_gguf.py dif-core/tests/test_rng_torch.py -k "int4 or q4_0 or torch_cuda" \
  --junitxml=/tmp/junit_gpu.xml >"$OUT/pytest_gpu.log" 2>&1
  echo "pytest rc=$?" >>"$OUT/pytest_gpu.log"
  python3 perf/junit_summary.py /tmp/junit_gpu.xml "$OUT/gpu_tests.json" --label "int4 / Q4_0 / torch-cuda seeds" \
    >/dev/null 2>&1) &
TESTS=$!

stamp "stage 3: the embedded default, trained on"
BASE_FROM=${BASE_FROM:-dif-frontend-flux2/src/dif_frontend_flux2/default} \
VAE_FROM=${VAE_FROM:-dif-frontend-flux2/src/dif_frontend_flux2/default/vae} \
  bash perf/h200_embedded.sh
wait "$TESTS"
tail -4 "$OUT/pytest_gpu.log"
cd "$OUT" && split -b 9000000 results.tgz results.tgz.part- && rm results.tgz && ls -la
stamp "done"
