#!/usr/bin/env bash
# Issue 16 on the H200, one device call: the embedded model's VAE alone, trained through dif on CUDA and judged
# by its clean renders (what any transformer trained on its latents can score at most):
#   stage 1  shape images (PER_COMBO x 189) and a random VAE of VAE_CHANNELS / VAE_GROUPS (base_checkpoint.py)
#   stage 2  train_vae.py on CUDA, batch VAE_BATCH of 128² crops, until TOTAL_S less the judge's share
#   stage 3  judge.py --vae on the 54 held-back scenes (CUDA), and the colour check
#   stage 4  $OUT/results.tgz: vae/ (config, weights, train_vae.json), the logs, the judge report
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_embedded_vae.sh 2>&1 | tee $OUT/run.log
# CPU rehearsal: DIF_H200_ENV=1 OUT=/tmp/vae_out BACKEND=cpu TOTAL_S=120 JUDGE_S=60 PER_COMBO=1 VAE_BATCH=2 \
#   JUDGE_LIMIT=3 bash perf/h200_embedded_vae.sh
source "$(dirname "$0")/h200_env.sh"
BACKEND=${BACKEND:-cuda}
TOTAL_S=${TOTAL_S:-540}
JUDGE_S=${JUDGE_S:-60}
PER_COMBO=${PER_COMBO:-16}
VAE_BATCH=${VAE_BATCH:-16}
VAE_CHANNELS=${VAE_CHANNELS:-16,32,32,32}
VAE_GROUPS=${VAE_GROUPS:-4}
LR=${LR:-2e-3}
JUDGE_LIMIT=${JUDGE_LIMIT:-}
HERE=dif-frontend-flux2/training/embedded
WORK=${WORK:-/tmp/embedded_vae}
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
stamp "stage 1: data ($PER_COMBO per combination) + a random VAE ($VAE_CHANNELS, $VAE_GROUPS groups)"
timeout 120 python3 $HERE/shapes.py "$WORK/data" --per-combo "$PER_COMBO" || exit 1
timeout 60 python3 $HERE/base_checkpoint.py "$WORK/base" --vae-channels "$VAE_CHANNELS" --vae-groups "$VAE_GROUPS" \
  || exit 1
TRAIN_S=$((TOTAL_S - (SECONDS - T0) - JUDGE_S - 10))
stamp "stage 2: VAE on $BACKEND (${TRAIN_S}s, its latent statistics and colour check included)"
timeout $((TRAIN_S + 30)) python3 $HERE/train_vae.py --data "$WORK/data" --source "$WORK/base/vae" --out "$WORK/vae" \
  --steps 1000000 --batch "$VAE_BATCH" --crop 128 --lr "$LR" --backend "$BACKEND" \
  --minutes "$(awk "BEGIN {print ($TRAIN_S - 25) / 60}")" 2>&1 | tee "$WORK/train_vae.log" \
  | grep -E "step (1|[0-9]*000)/|colour|Error"
echo "vae rc=${PIPESTATUS[0]}"
stamp "stage 3: clean renders through it, judged"
JT=$((TOTAL_S - (SECONDS - T0) - 8)); [ "$JT" -lt 20 ] && JT=20
timeout "$JT" python3 $HERE/judge.py --vae "$WORK/vae" --backend "$BACKEND" --out "$WORK/judge_vae.json" \
  ${JUDGE_LIMIT:+--limit "$JUDGE_LIMIT"} 2>&1 | tail -2
echo "judge rc=${PIPESTATUS[0]}"
stamp "stage 4: pack"
mkdir -p "$WORK/pack" && cp -r "$WORK/vae" "$WORK/pack/vae" && cp "$WORK"/train_vae.log "$WORK"/judge_vae.json "$WORK/pack/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$WORK/pack" . && ls -la "$OUT/results.tgz"
python3 -c "import json, sys; print('judge totals', json.load(open(sys.argv[1]))['totals'])" "$WORK/judge_vae.json" \
  2>/dev/null || echo "no judge report"
stamp "done"
