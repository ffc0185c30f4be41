#!/usr/bin/env bash
# Stop 17, GPU-machine call 3 (diagnostics):
#   stage 1  klein-9B LoRA training step 1024^2, dif vs torch+peft, with dif's step profiled by op and shape
#   stage 2  MiniMax-H3 one DiT forward at the default canvas with DIF_CUDA_TUNE=on (tuned GEMM algorithms
#            and cuDNN attention plans) beside diffusers eager
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_call3_17.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: klein-9B LoRA step, profiled"
timeout 230 python3 perf/train_lora_step.py --iters 3 --warm 1 --no-checkpoint-variant --profile 40 \
  --out-dir "$OUT" 2>&1 | tail -12
stamp "stage 2: H3 DiT forward, tuned"
LEFT=$((${LIMIT:-440} - (SECONDS - T0)))
DIF_CUDA_TUNE=on timeout "$LEFT" python3 perf/h3_dit_forward.py --iters 3 2>&1 | tail -12
stamp "done"
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
