# Sourced last by perf/h200_boundary.sh (AFTER=perf/h200_final_after.sh): the GGUF pair on the klein-9B folder
# (perf/h200_gguf_trace.sh without the trace), then SD-Turbo through perf/bench_sdturbo.py (CUDA against
# diffusers eager and torch.compile, and NVIDIA OpenCL) in whatever time the call has left (CALL_S in all).
TRACE=0 GGUF_ROUNDS=${GGUF_ROUNDS:-0} source perf/h200_gguf_trace.sh
LEFT=$(( ${CALL_S:-600} - (SECONDS - T0) - 15 ))
stamp "SD-Turbo bench, $LEFT s left"
if [ "$LEFT" -gt 60 ]; then
  mkdir -p "$OUT/sdturbo"
  timeout "$LEFT" python3 perf/bench_sdturbo.py --device cuda --compile --opencl --opencl-dtypes f16 \
    --deadline-s $((LEFT - 15)) --out-dir "$OUT/sdturbo" 2>&1 | tail -30
  echo "bench_sdturbo rc=$?"
fi
