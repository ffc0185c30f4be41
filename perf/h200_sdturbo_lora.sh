#!/usr/bin/env bash
# One GPU-machine call (results packed into $OUT/results.tgz):
#   stage 1  CUDA tests: the SD-Turbo backends test (the tiny model through CUDA and OpenCL, one program at one
#            step), the fast paths (tiled transposes, split reductions among them) and choices (conv-form /
#            sdpa-form through tuning.choose_form), the conformance cases of linear_add, conv2d, sdpa,
#            transpose and the reductions
#   stage 2  SD-Turbo f16, DIF_CUDA_TUNE=on: the UNet beside diffusers eager and torch.compile; prompt -> image
#            (KL VAE, TAESD) as one program and with the stages apart, beside StableDiffusionPipeline; the
#            pipeline through NVIDIA OpenCL f32 / f16
#   stage 3  the klein-9B LoRA step at 1024^2 with its profile by op and shape (issue 16), in the time left
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_sdturbo_lora.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
stamp "stage 1: CUDA tests"
timeout 130 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_fast_paths_cuda.py \
  dif-backend-cuda/tests/test_choices.py dif-frontend-sdturbo/tests/test_backends.py \
  dif-backend-cuda/tests/test_conformance_cuda.py -k "not conformance or linear_add or conv2d or sdpa or transpose or reduce" \
  --junitxml=/tmp/junit1.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_cuda.log" | tail -15
python3 perf/junit_summary.py /tmp/junit1.xml "$OUT/cuda_tests_h200.json" --label "CUDA tests (perf/h200_sdturbo_lora.sh)" || true
stamp "stage 2: SD-Turbo f16 (tuned): UNet + compile, prompt -> image (one program / apart), OpenCL f32 / f16"
DIF_CUDA_TUNE=on timeout 300 python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --pipeline-dtype f16 \
  --compile --iters 20 --profile-iters 0 --opencl --opencl-dtypes f32,f16 --deadline-s 290 \
  --out-dir "$OUT/sdturbo_f16" 2>&1 | grep -v "kept in float32"
echo "sdturbo rc=$?"
LEFT=$((${LIMIT:-570} - (SECONDS - T0)))
stamp "stage 3: klein-9B LoRA step with its profile (${LEFT} s)"
if [ "$LEFT" -gt 90 ] && python3 -c "import peft" 2>/dev/null; then
  timeout "$LEFT" python3 perf/train_lora_step.py --iters 3 --warm 1 --no-checkpoint-variant --profile 40 \
    --out-dir "$OUT/lora" 2>&1 | tail -40
  echo "lora rc=$?"
fi
stamp "done"
cd "$OUT" && tar czf /tmp/results.tgz --exclude results.tgz --exclude run.log . && mv /tmp/results.tgz results.tgz \
  && find . -mindepth 1 ! -name results.tgz ! -name run.log -delete 2>/dev/null; ls -la "$OUT"
