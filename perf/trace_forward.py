"""One FLUX.2 [klein] transformer forward traced on a backend: does the trace's attribution (GEMM, attention,
elementwise, copies...) add up to the measured forward?

    python perf/trace_forward.py --model klein-9b --backend cuda [--nvtx] [--out perf/results/trace_klein9b_h200.json]
    python perf/trace_forward.py --model klein-4b --backend cpu --tiny        # the script itself, on a CPU
    nsys profile -o trace python perf/trace_forward.py --model klein-9b --backend cuda --nvtx   # NVTX ranges
    python perf/trace_forward.py --model klein-9b --backend cuda --save /tmp/k9 && \
        dif inspect /tmp/k9/program.difir --source --op 40 --plan /tmp/k9/plan.difplan --trace /tmp/k9/trace.jsonl

Full size: 1024x1024 (4096 image + 512 text tokens), batch 1, bf16, weights a tiled random pattern (timing
does not depend on their values; nothing is downloaded). Measured: the untraced forward (graph replay, the
median of --iters runs), then --traced traced runs (eager, CUDA events per node); reported: the traced
run's wall, the sum of its events by kind, the share of the wall they cover, and the ratio of the traced
forward to the untraced one (eager launches cost what the graph saves).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="klein-9b", choices=["klein-4b", "klein-9b"])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the miniature config (checks the script anywhere)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--traced", type=int, default=3)
    ap.add_argument("--nvtx", action="store_true", help="DIF_NVTX=1 for the traced runs")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--save", type=Path, default=None, help="folder: executed program, its plan and the trace")
    args = ap.parse_args()

    from denoiser_models import CONFIGS, TINY

    from dif import trace
    from dif.dtypes import DType
    from dif.runtime import prepare
    from dif.trace.attribute import attribute
    from dif_frontend_flux2.config import Flux2TransformerConfig
    from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj

    cfg = Flux2TransformerConfig.from_dict(dict((TINY if args.tiny else CONFIGS)[args.model]))
    grid, n_txt = (4, 8) if args.tiny else (64, 512)
    program = build_transformer(cfg, batch=1, n_img=grid * grid, n_txt=n_txt, dtype=DType.BF16)
    rng = np.random.default_rng(0)
    pattern = (rng.standard_normal(1 << 20) * 0.02).astype(DType.BF16.np)
    weights = {p.name: np.resize(pattern, p.type.shape) for p in program.params}
    cos, sin = flux2_rope_tables(n_txt, grid, grid, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    inputs = {
        "latents": rng.standard_normal((1, grid * grid, cfg.in_channels)).astype(DType.BF16.np),
        "text_features": rng.standard_normal((1, n_txt, cfg.joint_attention_dim)).astype(DType.BF16.np),
        "timestep_proj": flux2_timestep_proj([900.0], dtype=DType.BF16),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    os.environ.pop("DIF_TRACE_FILE", None)
    t0 = time.perf_counter()
    exe, plan = prepare(program, weights, args.backend)
    prepare_s = time.perf_counter() - t0
    exe.run(inputs)
    walls = []
    for _ in range(args.iters):
        t = time.perf_counter()
        exe.run(inputs)
        walls.append((time.perf_counter() - t) * 1000.0)
    if args.nvtx:
        os.environ["DIF_NVTX"] = "1"
    with trace.collecting() as docs:
        for _ in range(args.traced):
            exe.run(inputs)
    a = attribute(docs)
    if (
        args.save is not None
    ):  # for `dif inspect DIR/program.difir --source --op N --plan DIR/plan.difplan --trace DIR/trace.jsonl`
        from dif.plan.difplan import save_plan
        from dif.serialize.difir import save_program

        args.save.mkdir(parents=True, exist_ok=True)
        save_program(exe.program, args.save / "program.difir")
        save_plan(plan, args.save / "plan.difplan")
        (args.save / "trace.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    untraced = statistics.median(walls)
    per_run = a["wall_ms"] / max(1, a["executions"])
    result = {
        "model": args.model,
        "tiny": args.tiny,
        "backend": args.backend,
        "nodes": len(program.nodes),
        "prepare_s": round(prepare_s, 2),
        "untraced_forward_ms_median": round(untraced, 3),
        "untraced_forward_ms": [round(w, 3) for w in walls],
        "traced_forward_ms_mean": round(per_run, 3),
        "traced_over_untraced": round(per_run / untraced, 4),
        "attributed_share_of_traced_wall": round(a["attributed_ms"] / a["wall_ms"], 4) if a["wall_ms"] else None,
        # the measure: what the trace attributes per forward against the forward measured untraced
        "attributed_over_untraced_forward": round(a["attributed_ms"] / max(1, a["executions"]) / untraced, 4),
        "attribution": {k: a[k] for k in ("executions", "wall_ms", "attributed_ms", "unattributed_ms", "by_kind")},
        "top_ops": a["top_ops"][:15],
        "by_block": a["by_block"][:15],
        "nvtx": args.nvtx,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
