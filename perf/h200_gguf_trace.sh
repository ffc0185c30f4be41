# More GPU-machine stages, sourced by perf/h200_boundary.sh (AFTER=perf/h200_gguf_trace.sh) once the klein-9B
# folder is in $WORK/models/klein-9b:
#   issue 18  the transformer re-stored as Q8_0 GGUF (perf/gguf_q8.py), then a fresh bf16 and a fresh GGUF
#             `dif flux2 generate`: load / denoise seconds, steps/s and device memory from their --json documents
#   issue 20  one traced klein-9B forward (perf/trace_forward.py; attribution share), NVTX ranges under nsys
#             when it is installed, and `dif inspect --source --op N --plan --trace` on a fused op of that program
K9=$WORK/models/klein-9b
if [ "${TRACE:-1}" = 1 ]; then
stamp "issue 20: traced klein-9B forward"
timeout 240 python3 perf/trace_forward.py --model klein-9b --backend cuda --out "$OUT/trace_klein9b_h200.json" \
  --save /tmp/k9 2>&1 | tail -15
if command -v nsys >/dev/null; then
  timeout 200 nsys profile -o /tmp/k9_nsys --force-overwrite true python3 perf/trace_forward.py --model klein-9b \
    --backend cuda --nvtx --iters 2 --traced 1 >/dev/null 2>&1
  nsys stats --report nvtx_sum /tmp/k9_nsys.nsys-rep 2>&1 | head -30 > "$OUT/nsys_nvtx_sum.txt"
  head -30 "$OUT/nsys_nvtx_sum.txt"
else
  echo "nsys: not installed on this machine" | tee "$OUT/nsys_nvtx_sum.txt"
fi
if [ -f /tmp/k9/program.difir ]; then
  OP=$(python3 - <<'PY'
from dif.serialize.difir import load_program
p = load_program("/tmp/k9/program.difir")
print(next(n.id for n in p.nodes if n.op == "rms_norm_rope"))  # fused, and it reads a checkpoint weight
PY
)
  echo "fused op index: $OP"
  python3 -m dif_tools inspect /tmp/k9/program.difir --source --op "$OP" --plan /tmp/k9/plan.difplan \
    --trace /tmp/k9/trace.jsonl > "$OUT/inspect_fused_op.txt" 2>&1; echo "inspect rc=$?"
  python3 -m dif_tools inspect /tmp/k9/program.difir --source --op "$OP" --plan /tmp/k9/plan.difplan \
    --trace /tmp/k9/trace.jsonl --json > "$OUT/inspect_fused_op.json" 2>&1
  head -40 "$OUT/inspect_fused_op.txt"
fi
fi  # TRACE

if [ -d "$K9/transformer" ]; then
  stamp "issue 18: Q8_0 GGUF of the klein-9B transformer"
  /usr/bin/time -v timeout 300 python3 perf/gguf_q8.py "$K9/transformer" /tmp/k9-q8.gguf 2>&1 \
    | grep -E "Elapsed|Maximum resident|wrote|GiB|s$" | tail -6
  ls -l /tmp/k9-q8.gguf
  for kind in bf16 q8; do
    if [ $kind = bf16 ]; then MODEL_ARGS=(-m "$K9"); else MODEL_ARGS=(-m /tmp/k9-q8.gguf --base "$K9"); fi
    for round in ${GGUF_ROUNDS:-0 1}; do  # round 0 compiles what the GGUF path needs first; round 1: warm
      S=$SECONDS
      timeout 150 python3 -m dif_tools flux2 generate "${MODEL_ARGS[@]}" -p "a red fox in snow" --steps 4 -W 1024 \
        -H 1024 --seed 1 --backend cuda --dtype bf16 -o "/tmp/gguf_$kind.png" --json > "$OUT/gguf_${kind}_r$round.json" \
        2> "$OUT/gguf_${kind}_r$round.err"
      echo "$kind round $round rc=$? wall $((SECONDS - S)) s"
    done
  done
  python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image
out = Path(sys.argv[1])
doc = {}
for kind in ("bf16", "q8"):
    for r in (0, 1):
        if not (out / f"gguf_{kind}_r{r}.json").exists():
            continue
        try:
            d = json.loads((out / f"gguf_{kind}_r{r}.json").read_text())
        except Exception as exc:
            doc[f"{kind}_r{r}"] = {"error": str(exc)}
            continue
        doc[f"{kind}_r{r}"] = {k: d.get(k) for k in ("timings_s", "steps_per_s", "memory", "wall_s")}
a, b = (np.asarray(Image.open(f"/tmp/gguf_{k}.png").convert("RGB")).astype(np.float64) for k in ("bf16", "q8"))
mse = float(((a - b) ** 2).mean())
doc["q8_vs_bf16_psnr_db"] = float(10 * np.log10(255.0**2 / mse)) if mse else float("inf")
print(json.dumps(doc, indent=1)[:3000])
(out / "gguf_q8_vs_bf16_h200.json").write_text(json.dumps(doc, indent=1))
PY
fi
