#!/usr/bin/env bash
# One GPU-machine call after the one-shape refactor (issue 12) and the disk caches (issue 13), every stage
# time-boxed, results under $OUT:
#   stage 1  pytest dif-backend-cuda/tests (lowerings moved into lower/, plan-owned streaming, tuning cache)
#   stage 2  perf/bench_denoiser.py klein 9B: one forward, diffusers eager / torch.compile / dif, tuning on
#            (DIF_CUDA_TUNE=on: the stored choices then serve stage 3)
#   stage 3  dif bench perf/recipes/klein-9b-h200.json --no-reference --repeat 2: fresh processes, literal
#            prompt -> PNG, kernel cache and the transformer's tuned choices filled by stages 1-2
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; COMMIT=<sha> bash perf/h200_shape.sh 2>&1 | tee $OUT/run.log
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
T0=$SECONDS
stamp() { echo "== $((SECONDS - T0)) s: $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
SRC=dif-core/src:dif-backend-cpu/src:dif-backend-cuda/src:dif-frontend-flux2/src:dif-frontend-krea2/src:dif-tools/src
export PYTHONPATH=/tmp/site:$PWD/${SRC//:/:$PWD/}:$PWD/perf
export DIF_CACHE_DIR=/tmp/dif_cache
COMMIT=${COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader

stamp "stage 1: CUDA backend tests (commit $COMMIT)"
timeout 210 python3 -m pytest -q -p no:cacheprovider dif-backend-cuda/tests --junitxml=/tmp/cuda_junit.xml \
  >"$OUT/pytest_cuda.log" 2>&1
echo "pytest rc=$?"
tail -6 "$OUT/pytest_cuda.log"
python3 perf/junit_summary.py /tmp/cuda_junit.xml "$OUT/cuda_tests_h200.json" \
  --label "pytest dif-backend-cuda/tests on the H200" --meta "commit=$COMMIT"

stamp "stage 2: klein 9B forward, eager / compile / dif"
DIF_CUDA_TUNE=on timeout 190 python3 perf/bench_denoiser.py --models klein-9b --compile --iters 10 --budget-s 15 \
  --deadline-s 170 --out-dir "$OUT"
echo "bench rc=$?"
python3 perf/bench_denoiser.py --table-from "$OUT"

LEFT=$((560 - (SECONDS - T0)))
stamp "stage 3: fresh-process klein 9B prompt -> PNG, $LEFT s left"
if [ "$LEFT" -gt 120 ]; then
  RECIPE=perf/recipes/klein-9b-h200.json REPEAT=2 BENCH_ARGS="--no-reference" WORK=/tmp/dif_bench \
    timeout "$LEFT" bash perf/recipes/h200_bench.sh 2>&1 | tail -30
  python3 - <<'PY'
import json, pathlib
p = pathlib.Path("/tmp/dif_bench/bench.json")
if p.is_file():
    doc = json.loads(p.read_text())
    for rnd in doc["data"]["rounds"]:
        for s in rnd["stages"] if isinstance(rnd, dict) else rnd:
            t = s.get("telemetry") or {}
            ev = {e["name"]: e["ms"] for e in t.get("events", [])}
            mem = (t.get("data") or {}).get("memory", {})
            prep = {k: v.get("prepare_s") for k, v in mem.get("programs", {}).items()}
            print(s["name"], s.get("status"), s.get("wall_s"), ev, prep)
PY
fi
stamp "done"
