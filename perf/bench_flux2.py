"""FLUX.2 [klein] denoiser forward at full size: diffusers eager / torch.compile vs dif on CUDA.

Random bf16 weights (diffusers' own init, seeded) are shared: dif binds the diffusers state dict by name,
so both run the same function and their outputs are compared (relative L2). One forward at 1024x1024
(4096 image + 512 text tokens), batch 1; CUDA-event medians of --iters runs after warm-up.

Usage (GPU machine, repo root; diffusers + torch present):
    python3 perf/bench_flux2.py --models 4b,9b [--compile] [--iters 10]
Writes perf/results/bench_flux2_<model>.json (and $OUT/ when set); prints a table last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from dif.dtypes import DType
from dif.plan.planner import plan_program

CONFIGS: dict[str, dict[str, Any]] = {  # transformer/config.json of each model (shared/model-configs)
    "4b": {"num_attention_heads": 24, "num_layers": 5, "num_single_layers": 20, "joint_attention_dim": 7680},
    "9b": {"num_attention_heads": 32, "num_layers": 8, "num_single_layers": 24, "joint_attention_dim": 12288},
}
COMMON = {
    "_class_name": "Flux2Transformer2DModel",
    "attention_head_dim": 128,
    "axes_dims_rope": [32, 32, 32, 32],
    "eps": 1e-06,
    "guidance_embeds": False,
    "in_channels": 128,
    "mlp_ratio": 3.0,
    "out_channels": None,
    "patch_size": 1,
    "rope_theta": 2000,
    "timestep_guidance_channels": 256,
}
GRID, N_TXT, T_SCHED = 64, 512, 900.0


def cuda_median_ms(fn: Any, iters: int, warm: int, sync: Any, event: Any, elapsed: Any) -> tuple[float, list[float]]:
    for _ in range(warm):
        fn()
    sync()
    times = []
    for _ in range(iters):
        start, stop = event(), event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(elapsed(start, stop))
    return float(np.median(times)), times


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))


def bench_model(name: str, iters: int, do_compile: bool) -> dict[str, Any]:
    import cupy
    import ml_dtypes
    import torch
    from diffusers import Flux2Transformer2DModel
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    from dif_backend_cuda.device import CudaBackend
    from dif_frontend_flux2.config import Flux2TransformerConfig
    from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj

    config = {**COMMON, **CONFIGS[name]}
    out: dict[str, Any] = {"model": f"flux2-klein-{name}", "config": config, "tokens": [GRID * GRID, N_TXT]}
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = Flux2Transformer2DModel.from_config(config).to(torch.bfloat16).eval()
    out["torch_init_s"] = round(time.perf_counter() - t0, 1)
    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, GRID * GRID, 128), dtype=np.float32).astype(ml_dtypes.bfloat16)
    text = rng.standard_normal((1, N_TXT, config["joint_attention_dim"]), dtype=np.float32).astype(ml_dtypes.bfloat16)
    kwargs = {
        "hidden_states": torch.from_numpy(latents.view(np.int16)).view(torch.bfloat16).to(dev),
        "encoder_hidden_states": torch.from_numpy(text.view(np.int16)).view(torch.bfloat16).to(dev),
        "timestep": torch.tensor([T_SCHED / 1000.0], device=dev),
        "img_ids": Flux2KleinPipeline._prepare_latent_ids(torch.zeros(1, 128, GRID, GRID)).to(dev),
        "txt_ids": Flux2KleinPipeline._prepare_text_ids(torch.zeros(1, N_TXT, 1)).to(dev),
        "return_dict": False,
    }
    timing = {"sync": torch.cuda.synchronize, "event": lambda: torch.cuda.Event(enable_timing=True)}
    timing["elapsed"] = lambda a, b: a.elapsed_time(b)
    with torch.inference_mode():
        ref = model(**kwargs)[0]
        ms, _ = cuda_median_ms(lambda: model(**kwargs), iters, 3, **timing)
    out["diffusers_eager_ms"] = round(ms, 2)
    ref_np = ref.float().cpu().numpy()
    print(f"[{name}] diffusers eager {ms:.2f} ms", flush=True)

    # dif: same weights by name
    cfg = Flux2TransformerConfig.from_dict(config)
    program = build_transformer(cfg, batch=1, n_img=GRID * GRID, n_txt=N_TXT, dtype=DType.BF16)
    state = model.state_dict()
    missing = [p.name for p in program.params if p.name not in state]
    if missing:
        raise KeyError(f"dif parameters missing from the diffusers state dict: {missing[:5]}")
    t0 = time.perf_counter()
    weights = {
        p.name: state[p.name].detach().contiguous().view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
        for p in program.params
    }
    out["weights_to_host_s"] = round(time.perf_counter() - t0, 1)
    backend = CudaBackend()
    plan = plan_program(program, backend.profile(), backend.budget())
    exe = backend.prepare(program, plan, weights)
    del weights
    cos, sin = flux2_rope_tables(N_TXT, GRID, GRID, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    inputs = {
        "latents": latents,
        "text_features": text,
        "timestep_proj": flux2_timestep_proj([T_SCHED], dtype=DType.BF16),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    got = exe.run(inputs)[program.outputs[0]]
    stream = backend.stream
    dif_timing = {
        "sync": stream.synchronize,
        "event": cupy.cuda.Event,
        "elapsed": cupy.cuda.get_elapsed_time,
    }

    def replay() -> None:
        exe.execute()

    # cupy events record on the current stream: make the backend's stream current while timing
    with stream:
        ms, _ = cuda_median_ms(replay, iters, 3, **dif_timing)
    out["dif_ms"] = round(ms, 2)
    out["dif_rel_l2_vs_diffusers"] = rel_l2(got.astype(np.float32), ref_np)
    out["dif"] = {
        "nodes": len(program.nodes),
        "steps": len(exe.steps),
        "graph": exe.graph is not None,
        "arena_gib": round(plan.arena_bytes / 2**30, 2),
        "params_gib": round(plan.param_bytes / 2**30, 2),
        "timings": {k: round(v, 2) for k, v in exe.timings.items()},
        "profile_eager_ms": {k: round(v["ms"], 2) for k, v in exe.profile(iters=2).items()},
    }
    print(f"[{name}] dif {ms:.2f} ms, rel-L2 vs diffusers {out['dif_rel_l2_vs_diffusers']:.3e}", flush=True)
    exe = None  # free the device memory before torch.compile
    gc.collect()

    if do_compile:
        cmodel = torch.compile(model)
        with torch.inference_mode():
            t0 = time.perf_counter()
            cmodel(**kwargs)
            torch.cuda.synchronize()
            out["compile_s"] = round(time.perf_counter() - t0, 1)
            ms, _ = cuda_median_ms(lambda: cmodel(**kwargs), iters, 3, **timing)
        out["diffusers_compile_ms"] = round(ms, 2)
        print(f"[{name}] diffusers compile {ms:.2f} ms (compile {out['compile_s']} s)", flush=True)
        cmodel = None
    model = ref = state = None
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="4b")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    import torch

    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "python": platform.python_version()}
    dests = [Path("perf/results")] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
    rows = []
    for name in args.models.split(","):
        res = {"environment": env, **bench_model(name, args.iters, args.compile)}
        for d in dests:
            d.mkdir(parents=True, exist_ok=True)
            (d / f"bench_flux2_{name}.json").write_text(json.dumps(res, indent=1))
        rows.append(res)
    print("\nmodel            diffusers eager  diffusers compile  dif (CUDA graph)  dif rel-L2")
    for r in rows:
        comp = r.get("diffusers_compile_ms", float("nan"))
        print(
            f"{r['model']:16} {r['diffusers_eager_ms']:>12.2f} ms {comp:>14.2f} ms {r['dif_ms']:>13.2f} ms"
            f"  {r['dif_rel_l2_vs_diffusers']:.2e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
