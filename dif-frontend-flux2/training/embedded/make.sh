#!/usr/bin/env bash
# The whole recipe of the embedded demo model, from random weights to the judged default checkpoint.
#   dif-frontend-flux2/training/embedded/make.sh [WORK_DIR]      (run from anywhere; CPU only, hours on 2 cores)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
WORK="${1:-/tmp/dif-embedded}"
PKG="$REPO/dif-frontend-flux2/src/dif_frontend_flux2/default"
mkdir -p "$WORK"
# 0. the random tiny klein (width 128, default size 256) with the text encoder's branches quietened
python3 "$HERE/base_checkpoint.py" "$WORK/base"
# 1. 5,670 training images (189 of the 216 colour-shape-position combinations x 30, sizes and backgrounds drawn)
python3 "$HERE/shapes.py" "$WORK/data" --per-combo 30
# 2. the VAE as an autoencoder (+ BatchNorm statistics of its latents)
python3 "$HERE/train_vae.py" --data "$WORK/data" --source "$WORK/base/vae" --out "$WORK/base/vae" \
    --steps 1200 --batch 2 --crop 256
# 3. the transformer: dif train full's session on cached latents / text features, micro-batches of 8, the 4-step
#    sampler's sigma shift (the default), 32 text rows (base_checkpoint.py); the held right- vs wrong-caption
#    loss is logged every 1000 steps. The GPU version of the whole recipe: perf/h200_embedded.sh.
python3 "$HERE/train_transformer.py" --data "$WORK/data" -m "$WORK/base" --out "$WORK/run" --steps 20000 --batch 8 \
    --lr 1e-3 --warmup 200 --eval-every 1000
# 4. judged (into the package only once it passes: install_default.py, then perf/fit_preview.py)
cd "$REPO" && python3 "$HERE/judge.py" --model "$WORK/run/model" --out "$WORK/judge.json" --images "$WORK/judged"
