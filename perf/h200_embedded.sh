#!/usr/bin/env bash
# Issue 16 on the H200, one device call: train the embedded demo model (dif-frontend-flux2/training/embedded,
# README there) through dif's own training on CUDA, judge it, pack it. Every stage is time-boxed against one
# end time (TOTAL_S seconds after h200_env.sh started the clock); the transformer gets what the others leave:
#   stage 1  base checkpoint (width 128, 256², max_sequence_length 32) + 810 shape images          (~10 s)
#   stage 2  the VAE as an autoencoder, dif.train on $BACKEND, then its latent statistics          VAE_S
#   stage 3  the transformer: dif train full's session, micro-batches of $BATCH, the 4-step
#            sampler's sigma shift, held right- vs wrong-caption loss; saves every SAVE_MIN minutes
#            (a kill leaves the last saved model); stops cleanly at its deadline                   the rest
#   stage 4  `dif flux2 generate -p "a green circle in the middle"`, then the judge on the 54 held-back
#            prompts (its report written after every prompt)                                       JUDGE_S
#   stage 5  $OUT/results.tgz: model/ (links resolved), logs, train JSONs, judge JSON, 11 judged images PACK_S
# Device call (repo root, carry [".whl"]):
#   set -o pipefail; bash perf/h200_embedded.sh 2>&1 | tee $OUT/run.log
# CPU rehearsal here (no wheels to install: DIF_H200_ENV=1 skips the machine setup), a couple of minutes:
#   DIF_H200_ENV=1 OUT=/tmp/emb_out BACKEND=cpu TOTAL_S=200 VAE_S=30 JUDGE_S=60 PER_COMBO=2 BATCH=4 \
#     RESOLUTION=128 JUDGE_LIMIT=4 bash perf/h200_embedded.sh
source "$(dirname "$0")/h200_env.sh"
BACKEND=${BACKEND:-cuda}
TOTAL_S=${TOTAL_S:-525}      # the call's limit is ~540 s of wall time; the env setup above counts
VAE_S=${VAE_S:-90}           # VAE training (program build included); its statistics pass follows
JUDGE_S=${JUDGE_S:-90}       # one CLI generate (a fresh process), then 54 prompts at 256², 4 steps
PACK_S=${PACK_S:-10}
SAVE_MIN=${SAVE_MIN:-1}
PER_COMBO=${PER_COMBO:-30}   # 27 training combinations x 30 images
BATCH=${BATCH:-32}
LR=${LR:-1e-3}
RESOLUTION=${RESOLUTION:-256}
JUDGE_LIMIT=${JUDGE_LIMIT:-}
HERE=dif-frontend-flux2/training/embedded
WORK=${WORK:-/tmp/embedded}
END=$((T0 + TOTAL_S))
left() { echo $((END - SECONDS)); }
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
echo "backend $BACKEND, total ${TOTAL_S}s, VAE ${VAE_S}s, judge ${JUDGE_S}s, batch $BATCH, lr $LR, work $WORK"

stamp "stage 1: base checkpoint + data"
timeout 60 python3 $HERE/base_checkpoint.py "$WORK/base" || exit 1
timeout 120 python3 $HERE/shapes.py "$WORK/data" --per-combo "$PER_COMBO" || exit 1

stamp "stage 2: VAE on $BACKEND (${VAE_S}s)"
VAE_MIN=$(awk "BEGIN {print ($VAE_S - 20) / 60}")  # 20 s for the latent statistics and the write
timeout $((VAE_S + 60)) python3 $HERE/train_vae.py --data "$WORK/data" --source "$WORK/base/vae" \
  --out "$WORK/base/vae" --steps 3000 --batch 8 --crop 128 --lr 2e-3 --backend "$BACKEND" --minutes "$VAE_MIN" \
  2>&1 | tee "$WORK/train_vae.log" | grep -E "step (1|[0-9]*00)/|steps" | tail -12
echo "vae rc=${PIPESTATUS[0]}"; cp "$WORK/base/vae/train_vae.json" "$OUT/" 2>/dev/null

TR_S=$(( $(left) - JUDGE_S - PACK_S ))
stamp "stage 3: transformer on $BACKEND (${TR_S}s, encode included)"
TR_MIN=$(awk "BEGIN {print ($TR_S - 15) / 60}")  # 15 s for the last evaluation, save and export
timeout --signal=TERM $((TR_S + 20)) python3 $HERE/train_transformer.py --data "$WORK/data" -m "$WORK/base" \
  --out "$WORK/run" --steps 100000 --minutes "$TR_MIN" --batch "$BATCH" --lr "$LR" --warmup 200 \
  --resolution "$RESOLUTION" --backend "$BACKEND" --save-minutes "$SAVE_MIN" --eval-every 500 --eval-samples 64 \
  2>&1 | tee "$WORK/train_transformer.log" | grep -E "^(encoded|eval|saved|\{)|step [0-9]*000 " | cut -c1-400
echo "transformer rc=${PIPESTATUS[0]}"

stamp "stage 4: generate + judge on $BACKEND ($(( $(left) - PACK_S ))s)"
if [ -f "$WORK/run/model/transformer/diffusion_pytorch_model.safetensors" ]; then
  timeout 40 python3 -m dif_tools flux2 generate -m "$WORK/run/model" -p "a green circle in the middle" \
    --backend "$BACKEND" --seed 0 -o "$WORK/green_circle.png" --json > "$WORK/green_circle.json" 2>&1
  echo "generate rc=$?"
  JT=$(( $(left) - PACK_S - 5 )); [ "$JT" -lt 20 ] && JT=20  # the judge writes its report after every prompt
  timeout "$JT" python3 $HERE/judge.py --model "$WORK/run/model" --backend "$BACKEND" \
    --out "$WORK/judge.json" --images "$WORK/judged" ${JUDGE_LIMIT:+--limit "$JUDGE_LIMIT"} 2>&1 | tail -3
  echo "judge rc=${PIPESTATUS[0]}"
else
  echo "no saved model: nothing to judge"
fi

stamp "stage 5: pack"
mkdir -p "$WORK/pack/judged"
cp -rL "$WORK/run/model" "$WORK/pack/model" 2>/dev/null
cp "$WORK"/train_*.log "$WORK"/run/train_transformer.json "$WORK"/base/vae/train_vae.json "$WORK"/judge.json \
  "$WORK"/green_circle.png "$WORK"/green_circle.json "$WORK/pack/" 2>/dev/null
ls "$WORK"/judged/*.png 2>/dev/null | awk 'NR % 5 == 1' | xargs -r cp -t "$WORK/pack/judged/"  # 11 of 54
du -sh "$WORK/pack/model" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$WORK/pack" . && ls -la "$OUT/results.tgz"
python3 -c "import json, sys; print('judge totals', json.load(open(sys.argv[1]))['totals'])" "$WORK/judge.json" \
  2>/dev/null || echo "no judge report"
stamp "done"
