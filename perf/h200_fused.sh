#!/usr/bin/env bash
# One GPU-machine call (about 7 of its 9 allowed minutes; every stage is time-boxed, results go to $OUT):
#   stage 1  pytest dif-backend-cuda/tests (fused ops of dif.passes, weight streaming included)
#   stage 2  perf/bench_denoiser.py: FLUX.2 klein 9B and 4B, one denoiser forward, diffusers eager /
#            torch.compile / dif; dif again under a 12 GB memory budget (9B, weights streamed); prompt -> PNG
#            4 steps 1024^2 with per-stage times, diffusers eager / compiled vs dif's pipeline (9B, then 4B when
#            time is left); one `dif flux2 generate --json` run in a fresh process (embedded demo model)
#   stage 3  the table again, read back from the JSON (so it prints even when stage 2 ran out of time)
# Device call (repo root, carry [".whl"], timeout_s 600):  set -o pipefail; COMMIT=<sha> bash perf/h200_fused.sh 2>&1 | tee $OUT/run.log
# (COMMIT: the device copy's git metadata can be stale, so name the commit being measured)
# DRY=1 checks the script on a machine without a GPU (torch CPU + dif's CPU backend, miniatures, no pip install).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
T0=$SECONDS
LIMIT=${LIMIT:-530}  # seconds for the whole call: the device allows 600 per command
stamp() { echo "== $((SECONDS - T0)) s: $*"; }
SRC=dif-core/src:dif-backend-cpu/src:dif-backend-cuda/src:dif-backend-opencl/src:dif-frontend-flux2/src
SRC=$SRC:dif-frontend-krea2/src:dif-tools/src  # dif-tools: `python3 -m dif_tools flux2 generate` (stage 2)
SRC=$PWD/${SRC//:/:$PWD/}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ "${DRY:-0}" = 1 ]; then
  export PYTHONPATH=$SRC
  BENCH=(--device cpu --tiny --compile-backend eager) TESTS=(-m "not cuda")
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$SRC
  BENCH=() TESTS=()
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
fi

stamp "stage 1: CUDA backend tests (commit $COMMIT)"
timeout 200 python3 -m pytest -q -p no:cacheprovider dif-backend-cuda/tests "${TESTS[@]}" \
  --junitxml=/tmp/cuda_junit.xml >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"
tail -4 "$OUT/pytest_cuda.log"
python3 perf/junit_summary.py /tmp/cuda_junit.xml "$OUT/cuda_conformance_h200.json" \
  --label "pytest dif-backend-cuda/tests on the H200 (fused ops, weight streaming)" --meta "commit=$COMMIT"

# The bench gets what is left minus 25 s for stage 3; its optional phases (budget run, pipelines, CLI) are
# skipped, each saying so in the JSON, once they would end past --deadline-s.
LEFT=$((LIMIT - (SECONDS - T0) - 25))
stamp "stage 2: klein 9B + 4B: denoiser, 12 GB budget, prompt -> PNG pipelines, CLI ($LEFT s)"
timeout "$LEFT" python3 perf/bench_denoiser.py --models klein-9b,klein-4b --compile --iters 10 --budget-s 15 \
  --vram-budget 12GB --pipeline --pipeline-models klein-9b,klein-4b --pipeline-iters 5 --deadline-s $((LEFT - 20)) \
  --out-dir "$OUT" "${BENCH[@]}"
echo "bench rc=$?"

stamp "stage 3: summary"
python3 perf/bench_denoiser.py --table-from "$OUT"
stamp "done"
