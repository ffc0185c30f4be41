#!/usr/bin/env bash
# Stop 25's GPU-machine call, not run (no device time was left; the next session's first call). Results in $OUT:
#   stage 1  the int4_linear GPU tests, the tensor-core kernel (DIF_CUDA_INT4=mma, CudaBackend(int4="mma")) beside
#            the tile GEMM, bf16 / f16 / f32, groups of 32 / 64 / 128, and the tiny FLUX.2 denoiser through
#            quantize_int4 against the CPU; the lowering checks
#   stage 2  klein 4B one forward at 1024^2: bf16 against int4-group on each kernel (issue 17's "klein-4B step
#            time + memory"), the tile GEMM first (DIF_CUDA_INT4=tile), then mma
#   stage 3  klein 9B prompt -> PNG, 4 steps, 1024^2: bf16 against fp8-e4m3 over the denoiser only (the default
#            DIF_FORMAT_STAGES) and over every program (fp8-e4m3@all, the stop-16 run that the gate rejected at
#            rel-L2 0.0668), the gate's numbers for both
# If stage 1 passes, DIF_CUDA_INT4's default can become mma (dif-core/src/dif/env.py, device.py, docs/env.md).
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call1_25.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: int4_linear on the GPU"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_quant_cuda.py \
  dif-backend-cuda/tests/test_lowering.py -k "int4 or tiny_flux2" --junitxml=/tmp/junit_int4.xml \
  >"$OUT/pytest_int4.log" 2>&1
echo "pytest rc=$?"
tail -4 "$OUT/pytest_int4.log"
python3 perf/junit_summary.py /tmp/junit_int4.xml "$OUT/int4_tests.json" --label "int4_linear, tile and mma" >/dev/null 2>&1

for kernel in tile mma; do
  stamp "stage 2: klein 4B, int4-group on the $kernel kernel"
  DIF_CUDA_INT4=$kernel timeout 150 python3 perf/formats_h200.py --phase step --models klein-4b \
    --formats int4-group --iters 5 2>&1 | tail -6
  [ -f "$OUT/step_klein-4b.json" ] && mv "$OUT/step_klein-4b.json" "$OUT/step_klein-4b_int4_$kernel.json"
done

stamp "stage 3: klein 9B prompt -> PNG, fp8 over the denoiser and over every program"
timeout 240 python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats fp8-e4m3,fp8-e4m3@all \
  --runs 2 2>&1 | tail -6
stamp "done"
