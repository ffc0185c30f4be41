#!/usr/bin/env bash
# One GPU-machine call for the user's boundary (issue 13), run from a clean snapshot of a commit so the
# working tree's unfinished edits cannot leak in; every stage time-boxed, results under $OUT:
#   stage 1  pytest dif-backend-cuda/tests (empty kernel cache: one NVRTC program per kernel)
#   stage 2  dif bench on each of $RECIPES (default klein-4b-h200), in order, in one work dir (the recipes of
#            one model share its folder), dif caches EMPTY before the first: its round 0 is the machine's
#            first run, later rounds have the caches filled; a recipe with a dif-<budget> stage gets its PNG
#            compared with the unbudgeted one (they must be identical)
#   stage 3  one more fresh dif process under cProfile (caches filled): where the load time goes
#   AFTER    a script of more stages, sourced last with $WORK (the bench folder with its models) and $OUT
# Python files are byte-compiled first (as pip does at install; this machine does not write .pyc files).
# Device call (repo root; a snapshot tar of the commit beside it, carry [".whl"]):
#   git archive --format=tar.gz -o device-snapshot.tgz HEAD; then run:
#   set -o pipefail; bash perf/h200_boundary.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
export DIF_CACHE_DIR=/tmp/dif_cache_boundary
rm -rf "$DIF_CACHE_DIR"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  stamp "stage 1: CUDA backend tests"
  DIF_CACHE_DIR=/tmp/dif_cache_tests timeout "${TEST_S:-200}" python3 -m pytest -q -p no:cacheprovider -rs \
    ${TESTS:-dif-backend-cuda/tests} --junitxml=/tmp/cuda_junit.xml >"$OUT/pytest_cuda.log" 2>&1
  echo "pytest rc=$?"
  tail -8 "$OUT/pytest_cuda.log"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_cuda.log" | head -20
  python3 perf/junit_summary.py /tmp/cuda_junit.xml "$OUT/cuda_tests_h200.json" --label "pytest ${TESTS:-dif-backend-cuda/tests} on the H200"
fi

WORK=/tmp/bench
for ITEM in ${RECIPES:-klein-4b-h200}; do  # NAME or NAME:REPEAT
  RECIPE=${ITEM%%:*}
  ROUNDS=${ITEM#*:}; [ "$ROUNDS" = "$ITEM" ] && ROUNDS=${REPEAT:-2}
  stamp "stage 2: dif bench $RECIPE, repeat $ROUNDS"
  RECIPE=perf/recipes/$RECIPE.json REPEAT=$ROUNDS WORK=$WORK OUT=$WORK/out timeout "${BENCH_S:-330}" \
    bash perf/recipes/h200_bench.sh 2>&1 | grep -v "^\[" | tail -12
  cp "$WORK/bench.json" "$OUT/bench_$RECIPE.json" 2>/dev/null
  for budgeted in "$WORK"/dif-*.png; do
    [ -f "$budgeted" ] || continue
    python3 - "$budgeted" "$WORK/dif.png" "$OUT/identical_$RECIPE.json" <<'PY'
import hashlib, json, sys
import numpy as np
from PIL import Image
a, b = (np.asarray(Image.open(p).convert("RGB")).astype(np.int16) for p in sys.argv[1:3])
doc = {"budgeted": sys.argv[1], "unbudgeted": sys.argv[2], "identical": bool(a.shape == b.shape and (a == b).all()),
       "max_abs_diff": int(np.abs(a - b).max()) if a.shape == b.shape else None,
       "sha256": [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in sys.argv[1:3]]}
print(json.dumps(doc))
json.dump(doc, open(sys.argv[3], "w"), indent=1)
PY
    rm -f "$budgeted"
  done
  if [ "${DROP_MODELS_AFTER:-}" = "$RECIPE" ]; then rm -rf "$WORK/models"; fi
done

stamp "stage 3: one fresh dif process under cProfile"
MODEL=$(ls -d "$WORK"/models/* 2>/dev/null | head -1)
[ "${PROFILE:-1}" = 1 ] || MODEL=""
if [ -n "$MODEL" ]; then
  timeout 120 python3 -m cProfile -o "$OUT/dif.prof" -m dif_tools flux2 generate -m "$MODEL" -p "a red fox in snow" \
    --steps 4 -W 1024 -H 1024 --seed 0 --backend cuda --dtype bf16 -o /tmp/prof.png --json > "$OUT/prof_run.json"
  python3 - "$OUT/dif.prof" > "$OUT/prof.txt" <<'PY'
import pstats, sys
s = pstats.Stats(sys.argv[1])
s.sort_stats("cumulative").print_stats(60)
s.sort_stats("tottime").print_stats(40)
s.sort_stats("cumulative").print_callees("_lower|_finish|lower_node|_lt_step|LtMatmul|_text_runner", 12)
PY
  head -c 9000 "$OUT/prof.txt" | tail -c 7000
fi
if [ -n "${AFTER:-}" ]; then stamp "after: $AFTER"; source "$AFTER"; fi  # more stages on the same folder
stamp "done"
