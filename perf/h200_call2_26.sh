#!/usr/bin/env bash
# Stop 26's second GPU-machine call. Results in $OUT:
#   stage 1  GPU tests: int4_linear (tile and mma), sdpa_fp8 (unmasked, masked, the fallback), the tiny FLUX.2
#            denoiser through each format pass against the CPU, the conformance cases, the lowering checks
#   stage 2  one forward at 1024^2, bf16 against fp8-e4m3 and fp8-e4m3+attention: klein 9B, Krea 2, klein 4B
#   stage 3  klein 9B prompt -> PNG, 4 steps, 1024^2: bf16, fp8-e4m3 (denoiser only), fp8-e4m3+attention, with
#            the gate's numbers
#   stage 4  klein 9B fp8 + attention forward traced: where the time goes
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call2_26.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: GPU tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_quant_cuda.py \
  dif-backend-cuda/tests/test_lowering.py dif-backend-cuda/tests/test_conformance_cuda.py \
  -k "int4 or tiny_flux2 or sdpa_fp8 or lowering" --junitxml=/tmp/junit_q.xml >"$OUT/pytest_quant.log" 2>&1
echo "pytest rc=$?"
tail -2 "$OUT/pytest_quant.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_quant.log" | head -20
python3 perf/junit_summary.py /tmp/junit_q.xml "$OUT/quant_tests.json" --label "int4 / sdpa_fp8 GPU tests" >/dev/null 2>&1

for model in klein-9b krea2 klein-4b; do
  stamp "stage 2: $model one forward"
  timeout 170 python3 perf/formats_h200.py --phase step --models $model --formats fp8-e4m3,fp8-e4m3+attention \
    --iters 10 2>&1 | tail -4
done

stamp "stage 3: klein 9B prompt -> PNG, fp8 and fp8 + attention"
timeout 250 python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats fp8-e4m3,fp8-e4m3+attention \
  --runs 2 2>&1 | tail -5
stamp "stage 4: klein 9B fp8 + attention forward traced"
DIF_PASSES=default,quantize_fp8,quantize_fp8_attention timeout 90 python3 perf/trace_forward.py --model klein-9b \
  --backend cuda --iters 5 --traced 2 --out "$OUT/trace_klein9b_fp8_attention.json" 2>&1 | tail -16
stamp "done"
