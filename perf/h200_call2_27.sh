#!/usr/bin/env bash
# Stop 27's second GPU-machine call. Call 1 (H100) found the FLUX.2 VAE decoder at 1024^2 taking 227 ms, every
# conv on "heuristic's first plan" (DIF_CUDA_TUNE=cached, an empty store: a fresh machine), where the stop-13
# profile replayed it in 38.9 ms with timed plans. The convolutions now list cuDNN heuristic mode B's plans
# first (dif_backend_cuda.conv.HEURISTICS = B, A). Results in $OUT:
#   stage 1  the cuDNN convolution GPU tests and conformance cases
#   stage 2  the decoder alone as the pipeline runs it, plans from modes B then A (the new default), then from
#            mode A alone (as before)
#   stage 3  klein 9B prompt -> PNG at 1024^2, 4 steps, bf16 and fp8-e4m3 with the gate (perf/formats_h200.py)
#   stage 4  every cuDNN plan of every distinct conv problem of the decoder timed, under modes A and B over NCHW
#            and mode A over channels-last strides, torch's own convolution beside them (perf/probe_conv_plans.py)
#   stage 5  the decoder alone with DIF_CUDA_TUNE=on (every plan timed, the fastest kept): what timing reaches
#            (last: it stores its choices, which the cached mode would then read)
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call2_27.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: cuDNN convolution GPU tests"
gpu_tests conv "cuDNN convolution GPU tests" 90 dif-backend-cuda/tests/test_fast_paths_cuda.py \
  dif-backend-cuda/tests/test_conformance_cuda.py -k "conv"
stamp "stage 2: the decoder alone, plans from modes B, A (default), then mode A alone"
timeout 60 python3 perf/profile_vae.py --size 1024 --top 6 --variants pipeline --out "$OUT/profile_vae_ba.json" \
  2>&1 | tail -8
timeout 60 python3 perf/profile_vae.py --size 1024 --top 3 --variants pipeline --conv-heuristic A \
  --out "$OUT/profile_vae_a.json" 2>&1 | tail -5
stamp "stage 3: klein 9B prompt -> PNG, bf16 and fp8-e4m3"
timeout 170 python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats fp8-e4m3 --runs 2 2>&1 | tail -4
python3 -c "
import json; d = json.load(open('$OUT/pipeline_klein-9b.json'))['formats']
for f, r in d.items(): print(f, r.get('stages_s'), r.get('forward_ms'), (r.get('decode_probe') or {}).get('replay_ms'))
" 2>&1 | cut -c1-600
stamp "stage 4: every cuDNN plan of the decoder's convolutions"
timeout 200 python3 perf/probe_conv_plans.py --size 1024 --out "$OUT/probe_conv_plans.json" 2>&1 | tail -14
stamp "stage 5: the decoder alone, DIF_CUDA_TUNE=on"
DIF_CUDA_TUNE=on timeout 80 python3 perf/profile_vae.py --size 1024 --top 4 --variants pipeline \
  --out "$OUT/profile_vae_tuned.json" 2>&1 | tail -6
stamp "done"
