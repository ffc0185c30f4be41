#!/usr/bin/env bash
# Stop 17, GPU-machine call 5: issue 21's numbers in one run of perf/bench_sdturbo.py (f16, DIF_CUDA_TUNE=on):
# the UNet beside diffusers eager and torch.compile, prompt -> image (KL VAE, TAESD) beside
# StableDiffusionPipeline, and the pipeline through NVIDIA OpenCL (f32, f16) with the seed's pixel bar.
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_call5_17.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
stamp "SD-Turbo f16 (tuned): UNet + compile, prompt -> image, OpenCL f32/f16"
DIF_CUDA_TUNE=on timeout 290 python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --pipeline-dtype f16 \
  --compile --iters 20 --profile-iters 0 --opencl --opencl-dtypes f32,f16 --deadline-s 280 \
  --out-dir "$OUT/sdturbo_f16" 2>&1 | grep -v "kept in float32"
echo "sdturbo rc=$?"
stamp "done"
