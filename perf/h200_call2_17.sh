#!/usr/bin/env bash
# Stop 17, GPU-machine call 2: where SD-Turbo's prompt -> image spends its host time (bench_sdturbo's
# per-program run / execute+sync / graph times and a cProfile of whole generates), KL VAE and TAESD, f16, tuned.
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_call2_17.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "SD-Turbo f16 (tuned), pipeline only, host profile"
DIF_CUDA_TUNE=on timeout 200 python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --pipeline-dtype f16 \
  --iters 20 --skip unet --profile-iters 0 --deadline-s 190 --out-dir "$OUT/sdturbo_f16"
echo "sdturbo rc=$?"
stamp "done"
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
