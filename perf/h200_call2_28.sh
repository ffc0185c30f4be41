#!/usr/bin/env bash
# Stop 28's second GPU-machine call, not run (six starts found no machine; the device time ran out): the next
# session's first call. klein 9B's fp8 forward (83.1 ms on an H100 in call 1; issue 17 asks 75)
# with the single blocks' output projection input made by one kernel (concat_glu_quant: the attention output
# beside the MLP's GLU, quantized together) instead of glu + quantize_rows, and glu_quant's rows in registers;
# the pipeline's steps no longer restage the unchanged text features and RoPE tables (17 MB a step).
# Results in $OUT:
#   stage 1  the quantized ops' GPU tests (the new kernels against the references, the tiny FLUX.2 through the
#            format passes against the CPU)
#   stage 2  the PNG stage's halves on this machine's cores (perf/probe_png.py: 46 ms of the fp8 run in call 1)
#   stage 3  klein 9B one forward at 1024^2, bf16 and fp8-e4m3 (perf/formats_h200.py); then prompt -> PNG at
#            1024^2, 4 steps, bf16 and fp8-e4m3 with the gate (call 1: 0.604 and 0.454 s)
#   stage 4  the quantizing row kernels alone at klein 9B's single-block shapes against a copy of their bytes
#            (perf/probe_elementwise.py), staged kernels beside the register-resident ones
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call2_28.sh 2>&1 | tee $OUT/run.log
# (SKIP_PROBE=1 ends after stage 3, SKIP_PIPELINE=1 after the forward: for a session short of device time)
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: quantized ops' GPU tests"
gpu_tests quant "quantized ops' GPU tests" 120 dif-backend-cuda/tests/test_quant_cuda.py \
  dif-backend-cuda/tests/test_conformance_cuda.py dif-backend-cuda/tests/test_input_staging.py \
  -k "quant or scaled or int4 or sdpa or stag"
stamp "stage 2: PNG encoding"
timeout 60 python3 perf/probe_png.py --out "$OUT/probe_png.json" 2>&1 | tail -2
stamp "stage 3: klein 9B one forward"
timeout 130 python3 perf/formats_h200.py --phase step --models klein-9b --formats fp8-e4m3 --iters 10 2>&1 | tail -4
[ -n "${SKIP_PIPELINE:-}" ] && { stamp "done (stages 3b-4 skipped: SKIP_PIPELINE)"; exit 0; }
timeout 120 python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats fp8-e4m3 --runs 3 2>&1 | tail -4
python3 -c "
import json; d = json.load(open('$OUT/pipeline_klein-9b.json'))['formats']
for f, r in d.items(): print(f, r.get('stages_s'), r.get('forward_ms'))
" 2>&1 | cut -c1-600
[ -n "${SKIP_PROBE:-}" ] && { stamp "done (stage 4 skipped: SKIP_PROBE)"; exit 0; }
stamp "stage 4: the quantizing row kernels alone"
timeout 80 python3 perf/probe_elementwise.py --ops norm_modulate_quant,quantize_rows,glu_quant,concat_glu_quant \
  --out "$OUT/probe_elementwise.json" 2>&1 | cut -c1-300
stamp "done"
