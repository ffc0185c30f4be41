#!/usr/bin/env bash
# Issue 16 on the H200, one device call: the backward conformance kit on CUDA, then one klein-9B LoRA
# (rank 16, attention projections) training step at 1024x1024, dif vs torch/diffusers+peft on the same
# weights and batch (time, memory, first-step gradient cosine). Results under $OUT.
#   run from the repo root:  bash perf/h200_train.sh
source perf/h200_env.sh
stamp "backward conformance (CUDA)"
timeout 150 python3 perf/train_backward_cuda.py --out-dir "$OUT" 2>&1 | tail -45
stamp "klein-9B LoRA step 1024^2: dif vs torch"
timeout 400 python3 perf/train_lora_step.py --iters 5 --warm 2 --out-dir "$OUT" 2>&1 | tail -12
stamp "done"
