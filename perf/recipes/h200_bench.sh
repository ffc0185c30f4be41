#!/usr/bin/env bash
# One GPU-machine call running `dif bench` on a recipe of this folder; bench.json and the stage logs go to $OUT.
# The machine runs the working tree from PYTHONPATH (nothing pip-installed but the carried wheels), set up by
# perf/h200_env.sh, which also makes the `dif` entry points visible (perf/pipeline_wall.py: ensure_entry_points).
# Device call (repo root, carry [".whl"]):
#   RECIPE=perf/recipes/klein-4b-h200.json REPEAT=2 bash perf/recipes/h200_bench.sh 2>&1 | tail -40
WORK=${WORK:-/tmp/dif_bench}
source "$(dirname "$0")/../h200_env.sh"  # wheels, every distribution on PYTHONPATH, entry points (once per call)
mkdir -p "$WORK"
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
