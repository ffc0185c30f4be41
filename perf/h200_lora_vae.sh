#!/usr/bin/env bash
# One GPU-machine call (results packed into $OUT/results.tgz), issue 16 after this stop's training changes:
#   stage 1  CUDA tests: the fast paths (the portable convolution's split-K among them), the kernels' argument
#            check, the conformance kit's backward cases, conv2d and sdpa, the rendezvous
#   stage 2  the embedded VAE's training step (perf/profile_vae_step.py), as shipped and widened, after split-K
#   stage 3  the klein-9B LoRA step at 1024^2 (sdpa's backward without P transposes) beside torch + peft, with
#            its profile by op and shape, in the time left
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_lora_vae.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: CUDA tests"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-cuda/tests/test_fast_paths_cuda.py \
  dif-backend-cuda/tests/test_lowering.py dif-backend-cuda/tests/test_conformance_cuda.py \
  dif-core/tests/test_rendezvous.py -k "not test_conformance_cuda or backward or conv2d or sdpa" \
  --junitxml=/tmp/junit1.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_cuda.log" | tail -15
python3 perf/junit_summary.py /tmp/junit1.xml "$OUT/cuda_tests_h200.json" --label "CUDA tests (perf/h200_lora_vae.sh)" \
  || true
stamp "stage 2: the VAE's training step on CUDA after split-K"
for v in "8ch" "wide --channels 16,32,32,32 --groups 4"; do
  set -- $v; name=$1; shift
  timeout 60 python3 perf/profile_vae_step.py --backend cuda --batch 16 --crop 128 "$@" --out "$OUT/vae_step_$name.json" \
    | grep -E "step_ms_median"; echo "profile $name rc=${PIPESTATUS[0]}"
done
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps(d.get('by_op'))); \
print(json.dumps(dict(list(d.get('by_shape', {}).items())[:8]), indent=0))" "$OUT/vae_step_8ch.json" || true
LEFT=$((${LIMIT:-570} - (SECONDS - T0) - 15))
stamp "stage 3: klein-9B LoRA step with its profile (${LEFT} s)"
timeout "$LEFT" python3 perf/train_lora_step.py --iters 3 --warm 1 --no-checkpoint-variant --profile 40 \
  --out-dir "$OUT/lora" 2>&1 | tail -40
echo "lora rc=$?"
stamp "done"
cd "$OUT" && tar czf /tmp/results.tgz --exclude results.tgz --exclude run.log . && mv /tmp/results.tgz results.tgz \
  && find . -mindepth 1 ! -name results.tgz ! -name run.log -delete 2>/dev/null; ls -la "$OUT"
