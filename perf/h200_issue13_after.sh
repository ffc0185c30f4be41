# Sourced last by perf/h200_boundary.sh (AFTER=perf/h200_issue13_after.sh): where a warm fresh process spends
# the time outside dif's own timer (perf/boundary_phases.py: start, import, the command, exit) on the first
# model folder of the bench, the caches filled by the bench before it.
MODEL=$(ls -d "$WORK"/models/* 2>/dev/null | head -1)
if [ -n "$MODEL" ]; then
  stamp "boundary phases on $MODEL"
  timeout 200 python3 perf/boundary_phases.py --repeat "${PHASE_ROUNDS:-3}" --out "$OUT/phases_$(basename "$MODEL").json" \
    -- flux2 generate -m "$MODEL" -p "a red fox sitting in fresh snow at golden hour, photograph, shallow depth of field" \
    --steps 4 -W 1024 -H 1024 --seed 0 --backend cuda --dtype bf16 -o /tmp/phases.png --json
fi
