#!/usr/bin/env bash
# Issue 15's GPU call (MiniMax-H3), run from the repo root on the H200 (torch + diffusers there):
#   stage 1  the H3 CUDA tests: the tiny t2va loop and video decode on the CUDA backend vs the reference
#            interpreter (fp32) and bf16 vs fp32 (dif-frontend-h3/tests/test_pipeline_cuda.py)
#   stage 2  perf/h3_dit_forward.py: the full-size DiT (random bf16 weights, 66 GB), one forward at
#            768x1344x124 (37,966 rows), diffusers eager vs dif in the same run -> perf/results/h3_dit_forward.json
#   stage 3  dif h3 generate on the embedded tiny checkpoint with --backend cuda --json (prompt -> MP4)
# Results and logs go to $OUT. DRY=1 checks the script on a machine without a GPU (CPU backend, tiny DiT).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_h3}
mkdir -p "$OUT"
T0=$SECONDS
stamp() { echo "== $((SECONDS - T0)) s: $*"; }
if [ "${DRY:-0}" = 1 ]; then BENCH=(--device cpu --tiny --iters 1); BACKEND=cpu; else BENCH=(--iters 3); BACKEND=cuda; fi
stamp "stage 1: H3 CUDA tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs dif-frontend-h3/tests/test_pipeline_cuda.py \
  --junitxml="$OUT/h3_cuda_tests.xml" 2>&1 | tail -20
stamp "stage 2: full-size DiT forward, diffusers vs dif"
OUT="$OUT" timeout 900 python3 perf/h3_dit_forward.py "${BENCH[@]}" 2>&1 | tail -20
stamp "stage 3: dif h3 generate (tiny default) on $BACKEND"
timeout 300 python3 -m dif_tools h3 generate -p "rain on a tin roof" --backend "$BACKEND" --seed 1 \
  -o "$OUT/h3_tiny.mp4" --json >"$OUT/h3_generate.json" 2>"$OUT/h3_generate.err"; echo "rc=$?"
stamp done
