#!/usr/bin/env bash
# One GPU-machine call for issue 18's unmerged LoRA: the CUDA hot-swap tests of both frontends (one
# prepare, one captured graph, adapters swapped as inputs; each output vs a fresh merged prepare and the
# CPU reference, tolerance 1e-4), their pytest summaries and a JUnit XML in $OUT.
# Device call:  set -o pipefail; bash perf/h200_lora_swap.sh 2>&1 | tee $OUT/run.log   (carry [".whl"], timeout 600)
# The tests skip with the reason when CUDA cannot run: a skip in the summary means nothing was shown.
set -uo pipefail
source perf/h200_env.sh
stamp "LoRA hot swap on CUDA: FLUX.2 klein and Krea 2"
timeout 500 python3 -m pytest -q -rs -p no:cacheprovider --junitxml="$OUT/lora_swap_cuda.xml" \
  dif-frontend-flux2/tests/test_lora_swap_cuda.py dif-frontend-krea2/tests/test_lora_swap_cuda.py \
  2>&1 | tee "$OUT/lora_swap_cuda.txt"
echo "pytest rc=${PIPESTATUS[0]}"
stamp done
