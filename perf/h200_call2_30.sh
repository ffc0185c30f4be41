#!/usr/bin/env bash
# Stop 30's second GPU-machine call (after perf/h200_call1_30.sh): issue 17's side-by-side run, one forward at
# 1024^2 with diffusers eager AND torch.compile in the same process as dif bf16 and fp8-e4m3, for the three
# denoisers, and the klein 9B pipeline again. Run it on an H200 where one is lent (the issue's figures are the
# H200's); the results name the card. Each stage writes its results as it ends.
#   stage 1  Krea 2: diffusers eager + torch.compile, dif bf16 + fp8 (perf/formats_h200.py --compile)
#   stage 2  klein 9B, the same
#   stage 3  klein 9B prompt -> PNG, 4 steps, bf16 and fp8-e4m3 with the gate
#   stage 4  klein 4B one forward (eager diffusers only)
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call2_30.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
compiled() {  # MODEL SECONDS: one forward with torch.compile beside eager, bf16 and fp8
  stamp "$1 one forward, with torch.compile"
  timeout "$2" python3 perf/formats_h200.py --phase step --models "$1" --formats fp8-e4m3 --iters 10 --compile \
    2>&1 | tail -4
}
compiled krea2 220
compiled klein-9b 170
pipeline_9b 100
forward_step klein-4b
stamp "done"
