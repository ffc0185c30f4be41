#!/usr/bin/env bash
# Stop 26's third GPU-machine call. Results in $OUT:
#   stage 1  klein 9B one forward traced, fp8 linears alone and with fp8 attention: the time by opcode
#            (perf/trace_by_op.py), where the fp8 forward's ~90 ms go against issue 17's 75
#   stage 2  Krea 2 one forward at 1024^2 in bf16 against diffusers eager and torch.compile (issue 17: dif bf16
#            at least as fast as torch.compile; met at stop 16 on the H200, 217.6 against 222.4 ms)
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call3_26.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
for variant in fp8 fp8_attention; do
  passes=default,quantize_fp8
  [ $variant = fp8_attention ] && passes=$passes,quantize_fp8_attention
  stamp "stage 1: klein 9B traced, $passes"
  DIF_PASSES=$passes timeout 100 python3 perf/trace_forward.py --model klein-9b --backend cuda --iters 3 \
    --traced 2 --save /tmp/trace_$variant >/dev/null 2>&1
  python3 perf/trace_by_op.py /tmp/trace_$variant/trace.jsonl --out "$OUT/by_op_klein9b_$variant.json" | head -12
done
stamp "stage 2: Krea 2 bf16 against torch.compile"
timeout 300 python3 perf/formats_h200.py --phase step --models krea2 --formats "" --compile --iters 10 2>&1 | tail -4
stamp "done"
