#!/usr/bin/env bash
# Stop 26's first GPU-machine call. Results in $OUT:
#   stage 1  the int4_linear GPU tests (tile and the tensor-core mma kernel, bf16 / f16 / f32, groups 32/64/128)
#   stage 2  cuDNN fp8 attention against bf16 at klein 4B / 9B / Krea 2's 1024² shapes (perf/probe_sdpa_fp8.py)
#   stage 3  klein 9B fp8 forward traced: where the time goes (GEMM, attention, quantize, elementwise)
#   stage 4  klein 4B one forward at 1024^2: bf16 against int4-group on the mma kernel (the tile kernel when mma
#            fails its tests)
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call1_26.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: int4_linear on the GPU"
timeout 100 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_quant_cuda.py \
  dif-backend-cuda/tests/test_lowering.py -k "int4 or tiny_flux2" --junitxml=/tmp/junit_int4.xml \
  >"$OUT/pytest_int4.log" 2>&1
rc=$?
echo "pytest rc=$rc"
tail -4 "$OUT/pytest_int4.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_int4.log" | head -20
python3 perf/junit_summary.py /tmp/junit_int4.xml "$OUT/int4_tests.json" --label "int4_linear, tile and mma" >/dev/null 2>&1

stamp "stage 2: cuDNN fp8 attention"
timeout 90 python3 perf/probe_sdpa_fp8.py --out "$OUT/probe_sdpa_fp8.json" 2>&1 | tail -5

stamp "stage 3: klein 9B fp8 forward traced"
DIF_PASSES=default,quantize_fp8 timeout 150 python3 perf/trace_forward.py --model klein-9b --backend cuda \
  --iters 5 --traced 2 --out "$OUT/trace_klein9b_fp8.json" 2>&1 | tail -25

kernel=mma
[ $rc -ne 0 ] && kernel=tile
stamp "stage 4: klein 4B, int4-group on the $kernel kernel"
DIF_CUDA_INT4=$kernel timeout 150 python3 perf/formats_h200.py --phase step --models klein-4b \
  --formats int4-group --iters 5 2>&1 | tail -6
[ -f "$OUT/step_klein-4b.json" ] && mv "$OUT/step_klein-4b.json" "$OUT/step_klein-4b_int4_$kernel.json"
stamp "done"
