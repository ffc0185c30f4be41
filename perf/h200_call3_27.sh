#!/usr/bin/env bash
# Stop 27's third GPU-machine call, not run (the session's device time ran out): the next session's first call.
# Call 2 (H100) found why the FLUX.2 VAE decoder took 225 ms at 1024^2: cuDNN's fast plans for its NCHW
# convolutions want their input and output's size as workspace (257 MiB to 1 GiB), so the 256 MiB shared
# workspace deselected them (024ae66) and slow fallback plans ran, 5 to 13 times slower
# (perf/probe_conv_plans.py: the 128 -> 128 3x3 at 1024^2 in 0.98 ms on heuristic A's first plan, 4.7 ms in
# the decoder). Plans needing more now share the large workspace (sdpa.LargeWorkspace). Results in $OUT:
#   stage 1  the cuDNN convolution and attention GPU tests and conformance cases
#   stage 2  the decoder alone as the pipeline runs it (perf/profile_vae.py)
#   stage 3  klein 9B prompt -> PNG at 1024^2, 4 steps, bf16 and fp8-e4m3 with the gate (perf/formats_h200.py)
#   stage 4  klein 9B one forward at 1024^2: bf16, fp8-e4m3, fp8-e4m3+attention (row kernels in registers now)
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call3_27.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: cuDNN convolution and attention GPU tests"
gpu_tests cudnn "cuDNN GPU tests" 100 dif-backend-cuda/tests/test_fast_paths_cuda.py \
  dif-backend-cuda/tests/test_conformance_cuda.py -k "conv or sdpa or attention"
stamp "stage 2: the decoder alone"
timeout 60 python3 perf/profile_vae.py --size 1024 --top 8 --variants pipeline --out "$OUT/profile_vae.json" \
  2>&1 | tail -10
stamp "stage 3: klein 9B prompt -> PNG, bf16 and fp8-e4m3"
timeout 170 python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats fp8-e4m3 --runs 3 2>&1 | tail -4
python3 -c "
import json; d = json.load(open('$OUT/pipeline_klein-9b.json'))['formats']
for f, r in d.items(): print(f, r.get('stages_s'), r.get('forward_ms'), (r.get('decode_probe') or {}).get('replay_ms'))
" 2>&1 | cut -c1-600
stamp "stage 4: klein 9B one forward"
timeout 120 python3 perf/formats_h200.py --phase step --models klein-9b --formats fp8-e4m3,fp8-e4m3+attention \
  --iters 10 2>&1 | tail -5
stamp "done"
