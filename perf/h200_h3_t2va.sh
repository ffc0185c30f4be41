#!/usr/bin/env bash
# Issue 15's must-show on the H200, one device call: a reduced-size whole MiniMax-H3 t2va run, prompt -> MP4,
# dif vs diffusers side by side (perf/h3_t2va.py), each run a fresh process:
#   stage 0  PyAV, which the GPU machine lacks: the carried av.tar.xz (the unpacked av wheel: av/ and av.libs/)
#            into /tmp/avsite, put on PYTHONPATH before anything imports av
#   stage 1  the checkpoint: published widths, DIT_LAYERS DiT blocks + 1 refiner, TEXT_LAYERS Qwen3-VL text
#            layers, the full-size video and audio VAEs, seeded random weights built on the GPU and written by
#            save_pretrained (~19.5 GB at the defaults) into /tmp/h3_t2va_work
#   stage 2  FRAMES frames at WIDTHxHEIGHT, STEPS grid points: one warm-up + REPEATS runs per side, alternating,
#            MP4s decoded -> $OUT/h3_t2va.json, $OUT/dif.mp4, $OUT/diffusers.mp4 (the last run of each)
# Every phase is stamped in the log; no measured run starts after BUDGET_S seconds of the call.
# Device call (repo root, carry [".whl", "av.tar.xz"], after perf/device_overlay.sh):
#   bash perf/h200_h3_t2va.sh > $OUT/run.log 2>&1; tail -40 $OUT/run.log
# CPU rehearsal (--tiny --device cpu, no machine setup, .venv's Python where there is one):
#   DRY=1 OUT=/tmp/h3dry bash perf/h200_h3_t2va.sh
set -uo pipefail
AV_TAR=${AV_TAR:-$PWD/av.tar.xz}  # read before h200_env.sh moves to its copy of the tree
AV_SITE=/tmp/avsite
if [ "${DRY:-0}" = 1 ]; then
  export DIF_H200_ENV=1  # a CPU: no wheels to install, no GPU to warm up
  PY=${PYTHON:-$([ -x .venv/bin/python ] && echo "$PWD/.venv/bin/python" || echo python3)}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  PY=${PYTHON:-python3}
fi
source "$(dirname "$0")/h200_env.sh"
DIT_LAYERS=${DIT_LAYERS:-4}
TEXT_LAYERS=${TEXT_LAYERS:-4}
FRAMES=${FRAMES:-22}
WIDTH=${WIDTH:-672}
HEIGHT=${HEIGHT:-384}
STEPS=${STEPS:-8}
REPEATS=${REPEATS:-2}
BUDGET_S=${BUDGET_S:-400}
WORK=${WORK:-/tmp/h3_t2va_work}

stamp "stage 0: PyAV from ${AV_TAR}"
if [ -f "$AV_TAR" ]; then
  rm -rf "$AV_SITE" && mkdir -p "$AV_SITE" && tar -xJf "$AV_TAR" -C "$AV_SITE" || exit 1
  init=$(find "$AV_SITE" -maxdepth 4 -path '*/av/__init__.py' | head -1)
  [ -n "$init" ] && export PYTHONPATH=$(dirname "$(dirname "$init")"):${PYTHONPATH:-}
fi
"$PY" -c "import av; print('PyAV', av.__version__, 'from', av.__file__)" || echo "no PyAV: MP4s cannot be written"

if [ "${DRY:-0}" = 1 ]; then
  ARGS=(--tiny --device cpu --work-dir "${WORK}_tiny")
else
  ARGS=(--device cuda --dit-layers "$DIT_LAYERS" --text-layers "$TEXT_LAYERS" --frames "$FRAMES" -W "$WIDTH"
        -H "$HEIGHT" --work-dir "$WORK")
fi
stamp "stage 1+2: perf/h3_t2va.py ${ARGS[*]} --steps $STEPS --repeats $REPEATS"
timeout 560 "$PY" perf/h3_t2va.py "${ARGS[@]}" --steps "$STEPS" --repeats "$REPEATS" --out-dir "$OUT" \
  --budget-s $((BUDGET_S - (SECONDS - T0))) 2>&1 | grep --line-buffered -v -E "it/s\]|s/it\]|FutureWarning|WeightNorm.apply"
echo "h3_t2va rc=${PIPESTATUS[0]}"
df -h /tmp | tail -1
ls -la "$OUT"
stamp done
