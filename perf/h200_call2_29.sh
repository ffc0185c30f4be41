#!/usr/bin/env bash
# Stop 29's second GPU-machine call: norm_modulate_quant with a warp per row (norm_modulate_quant_warp<N>: every
# reduction a shuffle, no block barrier; call 1 measured the block-per-row register kernel at 62 us a node,
# 0.91 TB/s, against 26 us for a copy of its bytes); Krea 2's gates (silu(gate) * up, attention * sigmoid(gate))
# quantized by one act_mul_quant kernel instead of the activation, mul and quantize_rows, and its adaptive norms
# by one rms_norm_modulate_quant instead of rms_norm, modulate and quantize_rows; and where each forward's time
# goes by op.
# Results in $OUT:
#   stage 1  the quantized ops' GPU tests (each norm_modulate_quant kernel against the reference), the lowering
#            checks, the input staging test
#   stage 2  norm_modulate_quant alone at klein 9B's shape: warp per row (4 or 8 rows a block), block per row,
#            staged; act_mul_quant and rms_norm_modulate_quant at Krea 2's shapes (perf/probe_elementwise.py)
#   stage 3  one forward at 1024^2, bf16 and fp8-e4m3, each with its time by op and by GEMM shape: klein 9B,
#            klein 4B, Krea 2 (perf/formats_h200.py --phase step)
#   stage 4  klein 9B prompt -> PNG, 4 steps, 1024^2, bf16 and fp8-e4m3 with the gate
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call2_29.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: quantized ops' GPU tests"
gpu_tests quant "quantized ops' GPU tests" 150 dif-backend-cuda/tests/test_quant_cuda.py \
  dif-backend-cuda/tests/test_lowering.py dif-backend-cuda/tests/test_conformance_cuda.py \
  dif-backend-cuda/tests/test_input_staging.py -k "quant or scaled or int4 or sdpa or stag or lowering or registers"
stamp "stage 2: norm_modulate_quant alone"
timeout 60 python3 perf/probe_elementwise.py --ops norm_modulate_quant,act_mul_quant,rms_norm_modulate_quant --out "$OUT/probe_elementwise.json" 2>&1 \
  | cut -c1-300
for model in klein-9b klein-4b krea2; do
  stamp "stage 3: $model one forward"
  timeout 150 python3 perf/formats_h200.py --phase step --models $model --formats fp8-e4m3 --iters 10 2>&1 | tail -4
  python3 -c "
import json; d = json.load(open('$OUT/step_$model.json'))['formats']
for f, r in d.items(): print(f, 'by op', dict(list(r.get('by_op', {}).items())[:9]))
" 2>&1 | cut -c1-700
done
stamp "stage 4: klein 9B prompt -> PNG"
timeout 120 python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats fp8-e4m3 --runs 3 2>&1 | tail -3
python3 -c "
import json; d = json.load(open('$OUT/pipeline_klein-9b.json'))['formats']
for f, r in d.items(): print(f, r.get('stages_s'), r.get('forward_ms'))
" 2>&1 | cut -c1-600
rm -f "$OUT"/*.jpg  # at most 8 files come back; the images are call 1 of stop 28's
stamp "done"
