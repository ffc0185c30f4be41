# Sourced last by perf/h200_boundary.sh (AFTER=perf/h200_call1_after.sh), with the klein-9B folder in $WORK:
#   1. where a fresh process's imports go now: `-X importtime` of one more warm `dif flux2 generate`, and
#      nvmath's cuBLASLt binding imported through dif (package __init__ skipped) against a full `import nvmath`
#   2. issue 17: klein 9B one forward at 1024^2, bf16 vs fp8-e4m3, diffusers eager and torch.compile in the
#      same run (perf/formats_h200.py --phase step), in whatever time the call has left (CALL_S in all)
MODEL=$(ls -d "$WORK"/models/* 2>/dev/null | head -1)
stamp "imports of a warm fresh process"
python3 -X importtime -m dif_tools flux2 generate -m "$MODEL" -p "a red fox in snow" --steps 4 -W 1024 -H 1024 \
  --seed 0 --backend cuda --dtype bf16 -o /tmp/importtime.png --json 2>"$OUT/importtime.txt" >"$OUT/importtime_run.json"
python3 - "$OUT/importtime.txt" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    if line.startswith("import time:") and "|" in line:
        _, cum, name = line[len("import time:"):].split("|")
        if cum.strip().isdigit():
            rows.append((int(cum), name.rstrip()))
print("total top-level import cumulative s:", round(sum(c for c, n in rows if not n.startswith("  ")) / 1e6, 3))
for cum, name in sorted(rows, reverse=True)[:25]:
    print(f"{cum / 1e6:8.3f} s {name}")
PY
python3 -c "import time; t = time.perf_counter(); from dif_backend_cuda.gemm import cublaslt_binding; \
lib = cublaslt_binding(); print('cublaslt_binding', round(time.perf_counter() - t, 3), 's, version', lib.get_version())"
python3 -c "import time; t = time.perf_counter(); import nvmath; print('import nvmath', round(time.perf_counter() - t, 3), 's')"
LEFT=$(( ${CALL_S:-600} - (SECONDS - T0) - 15 ))
stamp "formats step klein 9B, $LEFT s left"
if [ "$LEFT" -gt 90 ]; then
  timeout "$LEFT" python3 perf/formats_h200.py --phase step --models klein-9b --formats fp8-e4m3 --compile --iters 20 \
    2>&1 | grep -v "^\[" | tail -20
  echo "formats step rc=$?"
  cp -r perf/results/formats "$OUT/" 2>/dev/null
fi
