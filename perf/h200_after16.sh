#!/usr/bin/env bash
# One GPU-machine call after this stop's changes (every stage time-boxed, results in $OUT and packed into
# $OUT/results.tgz):
#   stage 1  CUDA tests of what changed: masked SDPA over the attended keys (fast paths, conformance), the fp8
#            file kept fp8, the Krea 2 and FLUX.2 LoRA hot swaps and the H3 pipeline (masked attention users)
#   stage 2  Krea 2 one forward at 1024^2: dif bf16 beside diffusers eager and torch.compile, time by shape
#   stage 3  SD-Turbo prompt -> image with DIF_CUDA_TUNE=on (the first run stores cuDNN / cuBLASLt choices,
#            the timed runs use them), the decode stage split, each program's time by shape
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_after16.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: CUDA tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs \
  dif-backend-cuda/tests/test_fast_paths_cuda.py "dif-backend-cuda/tests/test_conformance_cuda.py" \
  dif-frontend-flux2/tests/test_fp8_files.py dif-frontend-krea2/tests/test_lora_swap_cuda.py \
  dif-frontend-flux2/tests/test_lora_swap_cuda.py dif-frontend-h3/tests/test_pipeline_cuda.py \
  -k "not conformance or sdpa" --junitxml=/tmp/junit16.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; tail -8 "$OUT/pytest_cuda.log"
python3 perf/junit_summary.py /tmp/junit16.xml "$OUT/cuda_tests_h200.json" --label "stop 16 CUDA tests" || true
stamp "stage 2: Krea 2 forward"
timeout 280 python3 perf/bench_denoiser.py --models krea2 --compile --iters 10 --profile-iters 2 \
  --profile-max-s 10 --out-dir "$OUT/krea2"
echo "krea2 rc=$?"
stamp "stage 3: SD-Turbo (tuned)"
LEFT=$((560 - (SECONDS - T0)))
DIF_CUDA_TUNE=on timeout "$LEFT" python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --iters 10 \
  --deadline-s $((LEFT - 10)) --out-dir "$OUT/sdturbo"
echo "sdturbo rc=$?"
stamp "done"
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
