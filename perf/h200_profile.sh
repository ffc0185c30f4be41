#!/usr/bin/env bash
# One GPU-machine call that measures where time goes before optimizing (every stage time-boxed, results in
# $OUT, packed into $OUT/results.tgz since a call returns few files):
#   stage 1  the fp8-file CUDA test (a scaled fp8 klein file keeps fp8 on CUDA)
#   stage 2  SD-Turbo prompt -> image on CUDA (KL VAE, TAESD) beside diffusers, each program's time by shape
#   stage 3  Krea 2 one denoiser forward at 1024^2, dif's time by shape beside diffusers eager
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_profile.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: fp8 file on CUDA"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs dif-frontend-flux2/tests/test_fp8_files_cuda.py \
  >"$OUT/pytest_fp8_cuda.log" 2>&1
echo "pytest rc=$?"; tail -15 "$OUT/pytest_fp8_cuda.log"
stamp "stage 2: SD-Turbo"
timeout 170 python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --iters 10 --deadline-s 160 --out-dir "$OUT/sdturbo"
echo "sdturbo rc=$?"
stamp "stage 3: Krea 2 forward"
timeout 200 python3 perf/bench_denoiser.py --models krea2 --iters 10 --profile-iters 2 --profile-max-s 10 \
  --out-dir "$OUT/krea2"
echo "krea2 rc=$?"
stamp "done"
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
