#!/usr/bin/env bash
# Stop 26's fourth GPU-machine call, not run (too little device time was left to start a machine; the next
# session's first call). Results in $OUT:
#   stage 1  the quantized ops' GPU tests and conformance cases, the row kernels staged and in registers
#            (norm_modulate_quant / quantize_rows `*_vec_*`, DIF_CUDA_ROWS=registers); the masked attention's
#            tests and cases (its gather and row zeroing became shared helpers in efc4c91, not yet run on a GPU)
#   stage 2  klein 9B and klein 4B one forward at 1024^2, bf16 against fp8-e4m3, the row kernels staged, then in
#            registers
#   stage 3  the FLUX.2 VAE decoder alone at 1024^2 (perf/profile_vae.py): the klein 9B pipeline's decode stage took
#            236 ms at stops 16 and 26 (perf/formats_h200.py --phase pipeline), where this profile measured
#            38.9 ms at stop 13; the first lead to follow
# If stage 1 passes and stage 2 is faster, DIF_CUDA_ROWS's default can become registers (dif-core/src/dif/env.py,
# dif-backend-cuda/src/dif_backend_cuda/device.py, docs/env.md).
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call4_26.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: GPU tests"
timeout 90 python3 -m pytest -q -p no:cacheprovider dif-backend-cuda/tests/test_quant_cuda.py \
  dif-backend-cuda/tests/test_conformance_cuda.py dif-backend-cuda/tests/test_fast_paths_cuda.py \
  -k "quant or scaled or int4 or sdpa or mask" \
  --junitxml=/tmp/junit_q.xml >"$OUT/pytest_quant.log" 2>&1
echo "pytest rc=$?"
tail -2 "$OUT/pytest_quant.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_quant.log" | head -10
python3 perf/junit_summary.py /tmp/junit_q.xml "$OUT/quant_tests.json" --label "quantized ops GPU tests" >/dev/null 2>&1
for rows in staged registers; do
  for model in klein-9b klein-4b; do
    stamp "stage 2: $model one forward, DIF_CUDA_ROWS=$rows"
    DIF_CUDA_ROWS=$rows timeout 110 python3 perf/formats_h200.py --phase step --models $model --formats fp8-e4m3 \
      --iters 10 2>&1 | tail -3
    [ -f "$OUT/step_$model.json" ] && mv "$OUT/step_$model.json" "$OUT/step_${model}_rows_$rows.json"
  done
done
stamp "stage 3: the VAE decoder alone at 1024^2"
timeout 120 python3 perf/profile_vae.py --size 1024 --out "$OUT/profile_vae.json" 2>&1 | tail -12
stamp "done"
