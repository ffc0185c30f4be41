#!/usr/bin/env bash
# Stop 26's first GPU-machine call. Results in $OUT:
#   stage 1  GPU tests: the quantized ops (int4_linear on the tile and the tensor-core mma kernel; sdpa_fp8 on
#            cuDNN's fp8 attention, and its fallback), the tiny FLUX.2 denoiser through each format pass against
#            the CPU, the conformance cases of sdpa_fp8 / int4_linear, the lowering checks
#   stage 2  cuDNN fp8 attention against bf16 at klein 4B / 9B / Krea 2's 1024² shapes (perf/probe_sdpa_fp8.py)
#   stage 3  klein 9B one forward at 1024^2: bf16, fp8-e4m3, fp8-e4m3+attention (issue 17's <= 75 ms)
#   stage 4  klein 4B one forward: bf16, fp8-e4m3, fp8-e4m3+attention, int4-group on the mma kernel
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call1_26.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: GPU tests"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_quant_cuda.py \
  dif-backend-cuda/tests/test_lowering.py dif-backend-cuda/tests/test_conformance_cuda.py \
  -k "int4 or tiny_flux2 or sdpa_fp8 or lowering" --junitxml=/tmp/junit_q.xml >"$OUT/pytest_quant.log" 2>&1
echo "pytest rc=$?"
tail -3 "$OUT/pytest_quant.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_quant.log" | head -20
python3 perf/junit_summary.py /tmp/junit_q.xml "$OUT/quant_tests.json" --label "int4 / sdpa_fp8 GPU tests" >/dev/null 2>&1

stamp "stage 2: cuDNN fp8 attention"
timeout 60 python3 perf/probe_sdpa_fp8.py --out "$OUT/probe_sdpa_fp8.json" 2>&1 | tail -4

for model in klein-9b klein-4b; do
  formats=fp8-e4m3,fp8-e4m3+attention
  [ $model = klein-4b ] && formats=$formats,int4-group
  stamp "stage: $model one forward, $formats"
  DIF_CUDA_INT4=mma timeout 170 python3 perf/formats_h200.py --phase step --models $model --formats $formats \
    --iters 10 2>&1 | tail -6
done
stamp "done"
