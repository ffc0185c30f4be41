#!/usr/bin/env bash
# One GPU-machine call for issue 22 (beyond one GPU), what a single H200 can show:
#   stage 1  the Ulysses split's pieces on CUDA: klein 9B at 1024^2 (random bf16 weights), 2 ranks in one
#            process on the one GPU, all-to-alls on the host: cosine vs the unsplit program (>= 0.999)
#   stage 2  dif serve under load on the CUDA backend: 200 requests, 8 concurrent, embedded tiny klein
#            (needs starlette, uvicorn, httpx and their deps among the carried wheels)
#   stage 3  (only when 2+ GPUs are visible) one forward on 1 vs N GPUs over NCCL, klein 9B and H3
# Device call:  set -o pipefail; bash perf/h200_issue22.sh 2>&1 | tee $OUT/run.log   (carry [".whl"], timeout 600)
# Wheels to add to .whl (the device notes' fetch-wheels.sh NAME ...): starlette uvicorn h11 anyio sniffio
#   httpx httpcore certifi idna (and the usual nvmath-python nvidia-cudnn-frontend cattrs importlib_metadata).
# DRY=1 checks the script on a machine without a GPU (CPU backend, tiny configs, no environment set-up).
set -uo pipefail
if [ "${DRY:-0}" = 1 ]; then
  OUT=${OUT:-/tmp/h200_out}; mkdir -p "$OUT"; T0=$SECONDS
  stamp() { echo "== $((SECONDS - T0)) s: $*"; }
  SPLIT=(--model klein-9b --in-process 2 --tiny --backend cpu) SERVE=(--backend cpu --requests 16) GPUS=1
else
  source perf/h200_env.sh
  SPLIT=(--model klein-9b --in-process 2 --backend cuda) SERVE=(--backend cuda)
  GPUS=$(nvidia-smi -L | wc -l)
fi
stamp "stage 1: ulysses pieces on one device"
timeout 300 python3 perf/ulysses_forward.py "${SPLIT[@]}" --out "$OUT"; echo "stage 1 rc=$?"
stamp "stage 2: dif serve load"
timeout 200 python3 perf/serve_load.py "${SERVE[@]}" --out "$OUT/serve_load_${SERVE[1]}.json"; echo "stage 2 rc=$?"
if [ "$GPUS" -ge 2 ]; then
  stamp "stage 3: $GPUS GPUs over NCCL"
  COUNTS=1,2; [ "$GPUS" -ge 4 ] && COUNTS=1,2,4
  timeout 240 python3 perf/ulysses_forward.py --model klein-9b --gpus $COUNTS --out "$OUT"; echo "stage 3a rc=$?"
  timeout 300 python3 perf/ulysses_forward.py --model h3 --gpus $COUNTS --out "$OUT"; echo "stage 3b rc=$?"
else
  stamp "stage 3 skipped: $GPUS GPU visible (the NCCL runs need 2+)"
fi
stamp done
