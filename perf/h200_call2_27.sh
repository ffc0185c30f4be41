#!/usr/bin/env bash
# Stop 27's second GPU-machine call: why the FLUX.2 VAE decoder takes 227 ms at 1024^2 (call 1, H100), where the
# stop-13 profile replayed it in 38.9 ms with tuned plans: every conv took "heuristic's first plan"
# (DIF_CUDA_TUNE=cached and an empty store, as a fresh machine has it). Results in $OUT:
#   stage 1  every cuDNN plan of every distinct conv problem of the decoder timed, under heuristic modes A and B
#            over NCHW and mode A over channels-last strides, with torch's own convolution beside them
#            (perf/probe_conv_plans.py)
#   stage 2  the decoder alone, untuned, its convolutions' plans from cuDNN's heuristic mode B
#   stage 3  the decoder alone with DIF_CUDA_TUNE=on (every plan timed, the fastest kept): what timing reaches
#            (last: it stores its choices, which the cached mode would then read)
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call2_27.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: every cuDNN plan of the decoder's convolutions"
timeout 330 python3 perf/probe_conv_plans.py --size 1024 --out "$OUT/probe_conv_plans.json" 2>&1 | tail -16
stamp "stage 2: the decoder alone, the convolutions from heuristic mode B"
timeout 150 python3 perf/profile_vae.py --size 1024 --top 8 --variants pipeline --conv-heuristic B \
  --out "$OUT/profile_vae_heur_b.json" 2>&1 | tail -10
stamp "stage 3: the decoder alone, DIF_CUDA_TUNE=on"
DIF_CUDA_TUNE=on timeout 150 python3 perf/profile_vae.py --size 1024 --top 8 --variants pipeline \
  --out "$OUT/profile_vae_tuned.json" 2>&1 | tail -10
stamp "done"
