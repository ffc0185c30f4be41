#!/usr/bin/env bash
# Stop 27's first GPU-machine call (stop 26's fourth, which could not start, plus the decode-stage probes).
# Results in $OUT:
#   stage 1  the quantized ops' GPU tests and conformance cases, the row kernels staged and in registers
#            (norm_modulate_quant / quantize_rows `*_vec_*`, DIF_CUDA_ROWS=registers); the masked attention's
#            tests and cases (its gather and row zeroing became shared helpers in efc4c91, not yet run on a GPU)
#   stage 2  the FLUX.2 VAE decoder alone at 1024^2 (perf/profile_vae.py), as built and as the pipeline's decode
#            stage runs it (optimizer passes, 8-bit pixels on the device): the klein 9B pipeline's decode stage
#            took 236 ms at stops 16 and 26 (perf/formats_h200.py --phase pipeline), the decoder alone 38.9 ms
#   stage 3  klein 4B prompt -> PNG in bf16 with `decode_probe`: the pipeline's own decoder timed and profiled
#   stage 4  klein 9B and klein 4B one forward at 1024^2, bf16 against fp8-e4m3, the row kernels staged, then in
#            registers
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call1_27.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: GPU tests"
gpu_tests quant "quantized ops GPU tests" 120 dif-backend-cuda/tests/test_quant_cuda.py \
  dif-backend-cuda/tests/test_conformance_cuda.py dif-backend-cuda/tests/test_fast_paths_cuda.py \
  -k "quant or scaled or int4 or sdpa or mask"
stamp "stage 2: the VAE decoder alone at 1024^2, as built and as the pipeline runs it"
timeout 150 python3 perf/profile_vae.py --size 1024 --top 12 --out "$OUT/profile_vae.json" 2>&1 | tail -30
stamp "stage 3: klein 4B prompt -> PNG, bf16, with the decode probe"
timeout 150 python3 perf/formats_h200.py --phase pipeline --models klein-4b --formats "" --runs 2 2>&1 | tail -3
python3 -c "
import json; r = json.load(open('$OUT/pipeline_klein-4b.json'))['formats']['bf16']
print(r.get('stages_s')); p = r.get('decode_probe', {}); print({k: v for k, v in p.items() if k != 'profile_by_shape'})
for k, v in list(p.get('profile_by_shape', {}).items())[:12]: print(f\"{v['ms']:8.3f} ms {v['steps']:4d}  {k}\")
" 2>&1 | cut -c1-400
for rows in staged registers; do
  for model in klein-9b klein-4b; do
    stamp "stage 4: $model one forward, DIF_CUDA_ROWS=$rows"
    DIF_CUDA_ROWS=$rows timeout 110 python3 perf/formats_h200.py --phase step --models $model --formats fp8-e4m3 \
      --iters 10 2>&1 | tail -3
    [ -f "$OUT/step_$model.json" ] && mv "$OUT/step_$model.json" "$OUT/step_${model}_rows_$rows.json"
  done
done
stamp "done"
