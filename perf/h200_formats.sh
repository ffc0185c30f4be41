#!/usr/bin/env bash
# Physical formats on the H200 (issue 17), one GPU-machine call per PHASE (results go to $OUT and perf/results/formats/):
#   PHASE=step (default)  stage 1: the quantized ops' GPU tests (dif-backend-cuda/tests/test_quant_cuda.py, the op
#                         table's conformance cases of quantize_rows / norm_modulate_quant / scaled_linear /
#                         int4_linear, the lowering checks); stage 2: perf/formats_h200.py --phase step: klein 9B
#                         and 4B one denoiser forward at 1024^2, bf16 vs fp8-e4m3 / int8 / int4-group, diffusers
#                         eager and torch.compile in the same run; `dif formats-table --backend cuda`
#   PHASE=pipeline        perf/formats_h200.py --phase pipeline: klein 9B prompt -> PNG, 4 steps, 1024^2, bf16 vs
#                         fp8-e4m3 (the gate over the schedule, warm wall, side-by-side JPEG)
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; PHASE=step COMMIT=<sha> bash perf/h200_formats.sh 2>&1 | tee $OUT/run.log
# DRY=1 checks the script on a machine without a GPU (torch CPU + dif's CPU backend, miniatures).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
T0=$SECONDS
LIMIT=${LIMIT:-560}
PHASE=${PHASE:-step}
stamp() { echo "== $((SECONDS - T0)) s: $*"; }
SRC=dif-core/src:dif-backend-cpu/src:dif-backend-cuda/src:dif-frontend-flux2/src:dif-tools/src
SRC=$PWD/${SRC//:/:$PWD/}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ "${DRY:-0}" = 1 ]; then
  export PYTHONPATH=$SRC
  EXTRA=(--tiny --iters 2 --runs 1) TESTS=(-m "not cuda") COMPILE=()
else
  source "$(dirname "$0")/h200_env.sh"  # wheels, every src/ on PYTHONPATH and the entry points (backends)
  EXTRA=() TESTS=() COMPILE=(--compile)
fi

if [ "$PHASE" = step ]; then
  stamp "stage 1: quantized ops on the GPU (commit $COMMIT)"
  timeout 150 python3 -m pytest -q -p no:cacheprovider dif-backend-cuda/tests/test_quant_cuda.py \
    dif-backend-cuda/tests/test_lowering.py "dif-backend-cuda/tests/test_conformance_cuda.py::test_op" \
    -k "quant or scaled or int4 or int8 or test_every or test_planned" "${TESTS[@]}" >"$OUT/pytest_quant_cuda.log" 2>&1
  echo "pytest rc=$?"
  tail -25 "$OUT/pytest_quant_cuda.log"
  python3 -m dif_tools formats-table --backend "$([ "${DRY:-0}" = 1 ] && echo cpu || echo cuda)" | tee "$OUT/formats_table.txt"
  LEFT=$((LIMIT - (SECONDS - T0) - 10))
  stamp "stage 2: klein 9B + 4B one forward, bf16 vs fp8-e4m3 / int8 / int4-group ($LEFT s)"
  timeout "$LEFT" python3 perf/formats_h200.py --phase step --models ${MODELS:-klein-9b,klein-4b} \
    --formats fp8-e4m3,int8,int4-group "${COMPILE[@]}" "${EXTRA[@]}"
  echo "formats step rc=$?"
else
  LEFT=$((LIMIT - (SECONDS - T0) - 10))
  stamp "klein 9B prompt -> PNG, bf16 vs fp8-e4m3, the gate over the schedule ($LEFT s)"
  timeout "$LEFT" python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats ${FORMATS:-fp8-e4m3,fp8-e4m3@all} "${EXTRA[@]}"
  echo "formats pipeline rc=$?"
fi
stamp "done"
