#!/usr/bin/env bash
# Issue 16 on the H200, one device call: train the embedded demo model (dif-frontend-flux2/training/embedded,
# README there) through dif's own training on CUDA, judge it, pack it. Every stage is time-boxed against one
# end time (TOTAL_S seconds after h200_env.sh started the clock); the transformer gets what the others leave:
#   stage 1  base checkpoint (width 128, 256², max_sequence_length 32) + 1,512 shape images        (~10 s)
#   stage 2  the VAE as an autoencoder, dif.train on $BACKEND, then its latent statistics and the
#            colour check (|error| of each colour through it; a brief VAE decodes every colour brown)  VAE_S
#   stage 3  the transformer: dif train full's session, micro-batches of $BATCH, the 4-step
#            sampler's sigma shift, held right- vs wrong-caption loss; saves every SAVE_MIN minutes
#            (a kill leaves the last saved model); stops cleanly at its deadline                   the rest
#   stage 4  `dif flux2 generate -p "a green circle in the middle"`, then the judge on the 54 held-back
#            prompts (its report written after every prompt)                                       JUDGE_S
# A stage whose $BACKEND run fails (nothing saved) runs again on the CPU in the time it has left (the log says so).
#   stage 5  $OUT/results.tgz: model/ (links resolved), logs, train JSONs, judge JSON, 11 judged images PACK_S
# BASE_FROM=DIR starts from that checkpoint instead of base_checkpoint.py's random one (to go on training the
# installed default); VAE_FROM=DIR takes that trained VAE folder and skips stage 2; BASE_ARGS are
# base_checkpoint.py's options (a wider or deeper transformer: "--heads 6 --double-blocks 2 --single-blocks 2").
# Device call (repo root, carry [".whl"]):
#   set -o pipefail; bash perf/h200_embedded.sh 2>&1 | tee $OUT/run.log
# CPU rehearsal here (no wheels to install: DIF_H200_ENV=1 skips the machine setup), a couple of minutes:
#   DIF_H200_ENV=1 OUT=/tmp/emb_out BACKEND=cpu TOTAL_S=200 VAE_S=30 JUDGE_S=60 PER_COMBO=2 BATCH=4 \
#     RESOLUTION=128 JUDGE_LIMIT=4 bash perf/h200_embedded.sh
source "$(dirname "$0")/h200_env.sh"
BACKEND=${BACKEND:-cuda}
TOTAL_S=${TOTAL_S:-525}      # the call's limit is ~540 s of wall time; the env setup above counts
VAE_S=${VAE_S:-120}          # VAE training (program build included), its statistics and colour check
VAE_BATCH=${VAE_BATCH:-16}   # random 128² crops: 16 of them are 4 whole images' pixels
JUDGE_S=${JUDGE_S:-90}       # one CLI generate (a fresh process), then 54 prompts at 256², 4 steps
PACK_S=${PACK_S:-10}
SAVE_MIN=${SAVE_MIN:-1}
PER_COMBO=${PER_COMBO:-8}    # 189 training combinations x 8 images
BATCH=${BATCH:-32}
LR=${LR:-1e-3}
SAMPLER_SHARE=${SAMPLER_SHARE:-0}  # share of the training sigmas that are the 4-step sampler's own four
RESOLUTION=${RESOLUTION:-256}
JUDGE_LIMIT=${JUDGE_LIMIT:-}
HERE=dif-frontend-flux2/training/embedded
WORK=${WORK:-/tmp/embedded}
END=$((T0 + TOTAL_S))
left() { echo $((END - SECONDS)); }
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
echo "backend $BACKEND, total ${TOTAL_S}s, VAE ${VAE_S}s, judge ${JUDGE_S}s, batch $BATCH, lr $LR," \
  "sampler share $SAMPLER_SHARE, work $WORK"

stamp "stage 1: base checkpoint + data"
if [ -n "${BASE_FROM:-}" ]; then  # a trained checkpoint to go on from (the installed default, say)
  cp -rL "$BASE_FROM" "$WORK/base" || exit 1
else
  # shellcheck disable=SC2086
  timeout 60 python3 $HERE/base_checkpoint.py "$WORK/base" ${BASE_ARGS:-} || exit 1
fi
timeout 120 python3 $HERE/shapes.py "$WORK/data" --per-combo "$PER_COMBO" || exit 1

stamp "stage 2: VAE on $BACKEND (${VAE_S}s)"
VAE_END=$((SECONDS + VAE_S))
vae() {  # BACKEND BATCH SECONDS: 20 s of them for the latent statistics and the write
  timeout $(($3 + 60)) python3 $HERE/train_vae.py --data "$WORK/data" --source "$WORK/base/vae" \
    --out "$WORK/base/vae" --steps 20000 --batch "$2" --crop 128 --lr 2e-3 --backend "$1" \
    --minutes "$(awk "BEGIN {print ($3 - 20) / 60}")" 2>&1 | tee -a "$WORK/train_vae.log" \
    | grep -E "step (1|[0-9]*00)/|steps|colour|Error" | tail -12
  return "${PIPESTATUS[0]}"
}
if [ -n "${VAE_FROM:-}" ]; then  # a VAE trained already (train_vae.py elsewhere): no VAE stage
  rm -rf "$WORK/base/vae" && cp -rL "$VAE_FROM" "$WORK/base/vae" && rc=0 || exit 1
  echo "vae from $VAE_FROM"
else
  vae "$BACKEND" "$VAE_BATCH" "$VAE_S"; rc=$?; echo "vae rc=$rc"
fi
if [ "$rc" != 0 ] && [ "$BACKEND" != cpu ]; then  # measured on 2 CPU cores: batch 2, crop 128, 7 it/s, loss 0.003 at 200
  stamp "stage 2 again on the CPU (the $BACKEND run failed)"
  LEFT_VAE=$((VAE_END - SECONDS)); [ "$LEFT_VAE" -lt 50 ] && LEFT_VAE=50
  vae cpu 2 "$LEFT_VAE"; echo "vae (cpu) rc=$?"
fi

transformer() {  # BACKEND BATCH SECONDS: 15 s of them for the last evaluation, save and export
  timeout --signal=TERM $(($3 + 20)) python3 $HERE/train_transformer.py --data "$WORK/data" -m "$WORK/base" \
    --out "$WORK/run" --steps 100000 --minutes "$(awk "BEGIN {print ($3 - 15) / 60}")" --batch "$2" --lr "$LR" \
    --warmup 200 --resolution "$RESOLUTION" --backend "$1" --save-minutes "$SAVE_MIN" --eval-every 500 \
    --eval-samples 64 --sampler-share "$SAMPLER_SHARE" 2>&1 | tee -a "$WORK/train_transformer.log" \
    | grep -E "^(encoded|eval|saved|\{)|step [0-9]*000 |Error" | cut -c1-400
  return "${PIPESTATUS[0]}"
}
MODEL_FILE="$WORK/run/model/transformer/diffusion_pytorch_model.safetensors"
TR_S=$(( $(left) - JUDGE_S - PACK_S ))
stamp "stage 3: transformer on $BACKEND (${TR_S}s, encode included)"
transformer "$BACKEND" "$BATCH" "$TR_S"; rc=$?; echo "transformer rc=$rc"
if [ "$rc" != 0 ] && [ ! -f "$MODEL_FILE" ] && [ "$BACKEND" != cpu ]; then  # nothing saved: the CPU, batch 8
  TR_S=$(( $(left) - JUDGE_S - PACK_S ))
  stamp "stage 3 again on the CPU (${TR_S}s; the $BACKEND run failed before its first save)"
  [ "$TR_S" -gt 40 ] && { transformer cpu 8 "$TR_S"; echo "transformer (cpu) rc=$?"; }
fi

stamp "stage 4: generate + judge on $BACKEND ($(( $(left) - PACK_S ))s)"
if [ -f "$MODEL_FILE" ]; then
  timeout 40 python3 -m dif_tools flux2 generate -m "$WORK/run/model" -p "a green circle in the middle" \
    --backend "$BACKEND" --seed 0 -o "$WORK/green_circle.png" --json > "$WORK/green_circle.json" 2>&1
  echo "generate rc=$?"
  JT=$(( $(left) - PACK_S - 5 )); [ "$JT" -lt 20 ] && JT=20  # the judge writes its report after every prompt
  timeout "$JT" python3 $HERE/judge.py --model "$WORK/run/model" --backend "$BACKEND" \
    --out "$WORK/judge.json" --images "$WORK/judged" ${JUDGE_LIMIT:+--limit "$JUDGE_LIMIT"} 2>&1 | tail -3
  rc=${PIPESTATUS[0]}; echo "judge rc=$rc"
  if [ "$rc" != 0 ] && [ ! -s "$WORK/judge.json" ] && [ "$BACKEND" != cpu ]; then  # nothing judged: the CPU
    JT=$(( $(left) - PACK_S - 5 )); [ "$JT" -lt 20 ] && JT=20
    timeout "$JT" python3 $HERE/judge.py --model "$WORK/run/model" --backend cpu --out "$WORK/judge.json" \
      --images "$WORK/judged" ${JUDGE_LIMIT:+--limit "$JUDGE_LIMIT"} 2>&1 | tail -3
    echo "judge (cpu) rc=${PIPESTATUS[0]}"
  fi
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
