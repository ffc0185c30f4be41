#!/usr/bin/env bash
# One GPU-machine call on a bare machine (empty dif caches): fresh-process prompt -> PNG, dif against diffusers in
# the same run, through `dif bench` on the committed recipes. klein 9B twice (round 0 = the machine's first run:
# NVRTC compiles, nothing tuned; round 1 = the kernel cache filled), then klein 4B once if time is left.
# Device call (repo root, carry [".whl"]):  set -o pipefail; bash perf/h200_fresh.sh 2>&1 | tee $OUT/run.log
set -uo pipefail
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
T0=$SECONDS
export DIF_CACHE_DIR=/tmp/dif_cache_fresh
run() {  # recipe name, repeat, work dir
  RECIPE=perf/recipes/$1.json REPEAT=$2 WORK=$3 OUT=$3/out bash perf/recipes/h200_bench.sh 2>&1 | grep -v "^\[" | tail -14
  cp "$3/bench.json" "$OUT/bench_fresh_$1.json" 2>/dev/null
}
echo "== klein-9b"; run klein-9b-h200 2 /tmp/b9
rm -rf /tmp/b9/models  # room on the disk for the next folder
if [ $((SECONDS - T0)) -lt 250 ]; then echo "== klein-4b"; run klein-4b-h200 1 /tmp/b4; fi
echo "== $((SECONDS - T0)) s: done"
