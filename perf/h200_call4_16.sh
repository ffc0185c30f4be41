#!/usr/bin/env bash
# One GPU-machine call after the decoders began making their pixels on the device (results in $OUT, packed
# into $OUT/results.tgz):
#   stage 1  CUDA tests of every pipeline that decodes (FLUX.2 edits and LoRA swap, Krea 2 LoRA swap, SD-Turbo
#            backends, H3 pipeline), the fp8 file kept fp8
#   stage 2  SD-Turbo prompt -> image f16, DIF_CUDA_TUNE=on
#   stage 3  one convolution alone (perf/probe_conv.py): the SD VAE's 256- and 128-channel 3x3 convolutions at 512^2
#   stage 4  klein 9B prompt -> PNG bf16 vs fp8-e4m3 (the gate over the schedule, the warm wall)
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_call4_16.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: CUDA tests"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rs dif-frontend-flux2/tests/test_edit_cuda.py \
  dif-frontend-flux2/tests/test_lora_swap_cuda.py dif-frontend-krea2/tests/test_lora_swap_cuda.py \
  dif-frontend-sdturbo/tests/test_backends.py dif-frontend-h3/tests/test_pipeline_cuda.py \
  dif-frontend-flux2/tests/test_fp8_files.py --junitxml=/tmp/junit4.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; tail -6 "$OUT/pytest_cuda.log"
python3 perf/junit_summary.py /tmp/junit4.xml "$OUT/cuda_tests_h200.json" --label "stop 16 call 4 CUDA tests" || true
stamp "stage 2: SD-Turbo f16"
DIF_CUDA_TUNE=on timeout 100 python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --pipeline-dtype f16 \
  --iters 20 --deadline-s 90 --out-dir "$OUT/sdturbo_f16"
echo "sdturbo rc=$?"
stamp "stage 3: convolutions alone"
for spec in "1,256,512,512 256" "1,128,512,512 128" "1,256,256,256 256"; do
  set -- $spec
  DIF_CUDA_TUNE=on timeout 60 python3 perf/probe_conv.py --shape "$1" --out-channels "$2" --out "$OUT/conv_${1//,/x}.json"
done
stamp "stage 4: klein 9B pipeline"
LEFT=$((560 - (SECONDS - T0)))
timeout "$LEFT" python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats fp8-e4m3 --runs 3
echo "pipeline rc=$?"
stamp "done"
cp -r perf/results/formats "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
