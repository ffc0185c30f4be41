#!/usr/bin/env bash
# One GPU-machine call running `dif bench` on a recipe of this folder; bench.json and the stage logs go to $OUT.
# The machine runs the working tree from PYTHONPATH (nothing pip-installed but the carried wheels), so the
# `dif` entry points are made visible first (perf/pipeline_wall.py: ensure_entry_points).
# Device call (repo root, carry [".whl"]):
#   RECIPE=perf/recipes/klein-4b-h200.json REPEAT=2 bash perf/recipes/h200_bench.sh 2>&1 | tail -40
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
WORK=${WORK:-/tmp/dif_bench}
mkdir -p "$OUT" "$WORK"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
SRC=dif-core/src:dif-backend-cpu/src:dif-backend-cuda/src:dif-frontend-flux2/src:dif-frontend-krea2/src:dif-tools/src
export PYTHONPATH=/tmp/site:$PWD/${SRC//:/:$PWD/}:$PWD/perf
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
python3 - "$RECIPE" "$WORK" "${REPEAT:-1}" ${BENCH_ARGS:-} <<'PY'
import sys
from pathlib import Path

from pipeline_wall import ensure_entry_points

ensure_entry_points(Path.cwd(), Path("/tmp/dif_entry_points"))  # also exported on PYTHONPATH for the stages
from dif_tools.cli import main

recipe, work, repeat, *rest = sys.argv[1:]
main(["bench", recipe, "--workdir", work, "--repeat", repeat, *rest])
PY
rc=$?
echo "bench rc=$rc"
cp "$WORK/bench.json" "$OUT/" 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "$WORK" --exclude models --exclude '*.png' . 2>/dev/null
exit $rc
