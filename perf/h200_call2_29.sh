#!/usr/bin/env bash
# Stop 29's second GPU-machine call: norm_modulate_quant with a warp per row (norm_modulate_quant_warp<N>: every
# reduction a shuffle, no block barrier; call 1 measured the block-per-row register kernel at 62 us a node,
# 0.91 TB/s, against 26 us for a copy of its bytes); Krea 2's gates (silu(gate) * up, attention * sigmoid(gate))
# quantized by one act_mul_quant kernel instead of the activation, mul and quantize_rows, and its adaptive norms
# by one rms_norm_modulate_quant instead of rms_norm, modulate and quantize_rows; and where each forward's time
# goes by op. Stages in order of need, each writing its results as it ends (a call cut short keeps them):
#   stage 1  the new and changed kernels' GPU tests against the references, input staging, the tiny FLUX.2
#            through the format passes against the CPU
#   stage 2  one forward at 1024^2, bf16 and fp8-e4m3, each with its time by op and by GEMM shape: Krea 2,
#            klein 9B (perf/formats_h200.py --phase step)
#   stage 3  the row kernels alone: norm_modulate_quant at klein 9B's shape (a warp per row, 4 or 8 rows a
#            block; a block per row; staged), act_mul_quant and rms_norm_modulate_quant at Krea 2's
#            (perf/probe_elementwise.py)
#   stage 4  klein 4B one forward; klein 9B prompt -> PNG, 4 steps, 1024^2, bf16 and fp8-e4m3 with the gate
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call2_29.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: GPU tests"
gpu_tests quant "new row kernels' GPU tests" 80 dif-backend-cuda/tests/test_quant_cuda.py \
  dif-backend-cuda/tests/test_input_staging.py -k "norm_modulate or act_mul or glu or fused_projection or stag or tiny_flux2"
step() {  # MODEL: one forward, bf16 and fp8, with the by-op times printed
  stamp "$1 one forward"
  timeout 150 python3 perf/formats_h200.py --phase step --models "$1" --formats fp8-e4m3 --iters 10 2>&1 | tail -4
  python3 -c "
import json; d = json.load(open('$OUT/step_$1.json'))['formats']
for f, r in d.items(): print(f, 'by op', dict(list(r.get('by_op', {}).items())[:10]))
" 2>&1 | cut -c1-800
}
step krea2
step klein-9b
stamp "stage 3: the row kernels alone"
timeout 60 python3 perf/probe_elementwise.py --ops norm_modulate_quant,act_mul_quant,rms_norm_modulate_quant \
  --out "$OUT/probe_elementwise.json" 2>&1 | cut -c1-300
step klein-4b
stamp "stage 4: klein 9B prompt -> PNG"
timeout 120 python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats fp8-e4m3 --runs 3 2>&1 | tail -3
python3 -c "
import json; d = json.load(open('$OUT/pipeline_klein-9b.json'))['formats']
for f, r in d.items(): print(f, r.get('stages_s'), r.get('forward_ms'))
" 2>&1 | cut -c1-600
rm -f "$OUT"/*.jpg  # at most 8 files come back; the images are call 1's
stamp "done"
