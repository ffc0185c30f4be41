#!/usr/bin/env bash
# One GPU-machine call (results packed into $OUT/results.tgz), issue 16: cuDNN's flash-attention backward
#   stage 1  CUDA tests: the conformance kit's sdpa_backward cases (cuDNN vs the reference), every sdpa
#            backward case (the bf16 ones now through sdpa_backward), the portable sdpa paths; the
#            binaries and reductions of the kernels touched (broadcast over 16-byte chunks, row reductions);
#            every backward case (linear's VJP changed) and the lowering tests (TESTS: another -k selection,
#            TEST_LIMIT: its time cap, 150 s)
#   stage 1b perf/probe_sdpa_backward.py: the statistics recompute and the backward apart, deterministic or not
#            (PROBE=0 skips it)
#   stage 2  the klein-9B LoRA step at 1024^2 beside torch + peft, with its profile by op and shape
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_attention_backward.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: CUDA tests"
timeout "${TEST_LIMIT:-150}" python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_conformance_cuda.py \
  dif-backend-cuda/tests/test_fast_paths_cuda.py dif-backend-cuda/tests/test_lowering.py \
  dif-core/tests/test_sdpa_backward.py -k "${TESTS:-sdpa or backward or binary or gated or reduc or mul or add or sub or test_lowering}" \
  --junitxml=/tmp/junit1.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_cuda.log" | tail -15
python3 perf/junit_summary.py /tmp/junit1.xml "$OUT/cuda_tests_h200.json" \
  --label "CUDA tests (perf/h200_attention_backward.sh)" || true
if [ "${PROBE:-1}" = 1 ]; then
  stamp "stage 1b: cuDNN's attention backward, its graphs timed apart"
  timeout 60 python3 perf/probe_sdpa_backward.py --out "$OUT/probe_sdpa_backward.json" | tail -22
fi
LEFT=$((${LIMIT:-570} - (SECONDS - T0) - 15))
stamp "stage 2: klein-9B LoRA step with its profile (${LEFT} s)"
timeout "$LEFT" python3 perf/train_lora_step.py --iters 3 --warm 1 --no-checkpoint-variant --profile 80 \
  --out-dir "$OUT/lora" 2>&1 | tail -40
echo "lora rc=$?"
stamp "done"
cd "$OUT" && tar czf /tmp/results.tgz --exclude results.tgz --exclude run.log . && mv /tmp/results.tgz results.tgz \
  && find . -mindepth 1 ! -name results.tgz ! -name run.log -delete 2>/dev/null; ls -la "$OUT"
