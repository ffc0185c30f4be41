"""Where the FLUX.2 VAE decoder's time goes on the CUDA backend (the pipeline's decode stage).

Builds the decoder from klein's published config (`pipeline_wall.VAE` carries it to the GPU machine) for one
image (latents packed as the sampler leaves them), draws random bf16 weights, prepares it on the CUDA backend,
and reports the graph replay time (median) and the eager per-op time split by shape and lowering, largest first;
for each of `VARIANTS` (the program as built, and as the pipeline's decode stage runs it).

Usage: python3 perf/profile_vae.py --size 1024 --out profile_vae.json  (needs a GPU and cupy)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dif_device_bridge import cuda_event_times  # noqa: E402
from pipeline_wall import VAE  # noqa: E402

VARIANTS = ("as-built", "pipeline")
"""as-built: the decoder as the frontend builds it, planned directly; pipeline: the program `Flux2Pipeline`'s
decode stage runs (through the default optimizer passes, ending in the picture's 8-bit pixels on the device)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024, help="image side in pixels")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--out", default="profile_vae.json")
    ap.add_argument("--conv-heuristic", default="", help="cuDNN heuristic modes for the convolutions, e.g. B or B,A")
    args = ap.parse_args()
    if args.conv_heuristic:
        use_conv_heuristic(args.conv_heuristic.split(","))

    from dif_backend_cuda.device import CudaBackend

    backend = CudaBackend()
    result: dict[str, Any] = {"size": args.size}
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
        result[variant] = profile(backend, args.size, variant, args.top)
        print(variant, json.dumps({k: v for k, v in result[variant].items() if not k.startswith("profile_")}))
        for key, v in result[variant]["profile_by_shape"].items():
            print(f"{v['ms']:8.3f} ms {v['steps']:4d}  {key}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


def use_conv_heuristic(modes: list[str]) -> None:
    """The convolutions' execution plans from cuDNN heuristic `modes` (then its fallback) instead of mode A."""
    from dif_backend_cuda import conv

    def finish(lib: Any, graph: Any, limit: int | None) -> None:
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([*(getattr(lib.heur_mode, m) for m in modes), lib.heur_mode.FALLBACK])
        if limit is not None:
            graph.deselect_workspace_greater_than(limit)
        graph.check_support()

    conv.finish_graph = finish


def profile(backend: Any, size: int, variant: str, top: int) -> dict[str, Any]:
    from dif.plan.planner import plan_program
    from dif.runtime import optimize_for
    from dif.testing.random_checkpoint import name_rng, random_weight
    from dif_frontend_flux2.config import Flux2VaeConfig
    from dif_frontend_flux2.vae import build_vae_decoder

    cfg = Flux2VaeConfig.from_dict(VAE)
    latent = size // 8
    pipeline = variant == "pipeline"
    program = build_vae_decoder(
        cfg, batch=1, latent_h=latent, latent_w=latent, dtype="bf16", from_packed=True, pixels=pipeline
    )
    if pipeline:
        program, _ = optimize_for(program, backend, backend.profile())
    weights = {}
    for p in program.params:
        w = random_weight(name_rng(p.name), p.name, p.type.shape)
        if p.name.endswith("running_var"):
            w = np.abs(w) + 1.0
        weights[p.name] = w.astype(p.type.dtype.np)
    t0 = time.perf_counter()
    exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), weights)
    prepare_s = time.perf_counter() - t0
    (latents,) = program.inputs
    inputs = {latents.name: np.random.default_rng(0).standard_normal(latents.type.shape).astype(latents.type.dtype.np)}
    run_s = []
    for _ in range(6):
        t0 = time.perf_counter()
        exe.run(inputs)
        run_s.append(time.perf_counter() - t0)
    replay = cuda_event_times(exe, 10, 0)
    by_shape = exe.profile(iters=3, by="shape")
    out = {
        "nodes": len(program.nodes),
        "prepare_s": round(prepare_s, 2),
        "run_s_median": round(statistics.median(run_s[1:]), 4),  # upload, replay, download
        "graph_ms_median": round(statistics.median(replay), 3),
        "graph": exe.graph is not None,
        "profile_by_op": {k: round(v["ms"], 3) for k, v in exe.profile(iters=3).items()},
        "profile_by_shape": dict(list(by_shape.items())[:top]),
    }
    exe.release()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
