"""FLUX.2 [klein] 4B denoiser forward on an OpenCL GPU (NVIDIA's platform on the H200) against dif's
CUDA backend on the same GPU: same program, same seeded random bf16 weights and inputs, at 512x512
(1024 image tokens) and 1024x1024 (4096), 512 text tokens. Reports cosine / rel-L2 of OpenCL vs CUDA
and both times (CUDA: graph-replay event median and `run()` wall median; OpenCL: `run()` wall median
of as many runs as the time box allows), plus OpenCL's device time by op at the first size.

On the GPU machine, first make NVIDIA's OpenCL platform visible:
    mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
    python3 perf/opencl_vs_cuda.py --device NVIDIA --sizes 512,1024 --deadline-s 140 \
        --conformance $OUT/opencl_conformance_h200.json --out $OUT/opencl_h200_klein4b.json
Check on a CPU (PoCL vs the CPU backend, miniature model):  python3 perf/opencl_vs_cuda.py --tiny --reference cpu
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from denoiser_models import CONFIGS, TINY, to_numpy  # noqa: E402
from dif_device_bridge import Device  # noqa: E402

from dif.dtypes import DType  # noqa: E402
from dif.ir.program import Program  # noqa: E402
from dif.plan.planner import plan_program  # noqa: E402

N_TXT = 512


def random_weights(program: Program, device: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random weights drawn with torch on `device`: matrices N(0, 1/fan_in), norm weights
    1 + N(0, 0.1^2), other vectors N(0, 0.02^2); returned as host arrays of each parameter's dtype."""
    import torch

    dtypes = {DType.BF16: torch.bfloat16, DType.F32: torch.float32, DType.F16: torch.float16}
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for p in program.params:
        shape = p.type.shape
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        if len(shape) >= 2:
            t *= float(np.prod(shape[1:])) ** -0.5
        elif "norm" in p.name:
            t = 1.0 + 0.1 * t
        else:
            t *= 0.02
        out[p.name] = to_numpy(t.to(dtypes[p.type.dtype]))
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a64 @ b64 / max(np.linalg.norm(a64) * np.linalg.norm(b64), 1e-300))


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))


def platforms() -> list[dict[str, Any]]:
    try:
        import pyopencl as cl

        return [
            {
                "platform": p.name.strip(),
                "version": p.version.strip(),
                "devices": [d.name.strip() for d in p.get_devices()],
            }
            for p in cl.get_platforms()
        ]
    except Exception as exc:
        return [{"error": f"{type(exc).__name__}: {exc}"}]


def wall_median(fn: Any, n: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times)), times


def grid_of(size: int, tiny: bool) -> int:
    """Latent tokens per side: 16 pixels a token (VAE /8, 2x2 packing); the miniature uses 128."""
    return size // (128 if tiny else 16)


def reserve(first_s: float, n_img: int, args: argparse.Namespace) -> float:
    """Seconds to keep for the sizes after this one: prepare + two runs of each, a run scaled from this
    one's by the token ratio (linear layers) squared-ish (attention), plus `reserve_s`."""
    later = [int(s) for s in args.sizes.split(",")]
    later = later[later.index(args.current) + 1 :]
    est = sum(2 * first_s * (grid_of(s, args.tiny) ** 2 / max(n_img, 1)) ** 1.5 + 10 for s in later)
    return args.reserve_s + est


def one_size(size: int, args: argparse.Namespace, cfg: Any, weights: dict[str, np.ndarray], ref_dev: Device,
             ocl: Any, deadline: float, res: dict[str, Any], save: Any) -> None:  # fmt: skip
    from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj

    grid = grid_of(size, args.tiny)
    n_txt = 8 if args.tiny else N_TXT
    program = build_transformer(cfg, batch=1, n_img=grid * grid, n_txt=n_txt, dtype=DType.BF16)
    rng = np.random.default_rng(size)
    cos, sin = flux2_rope_tables(n_txt, grid, grid, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    inputs = {
        "latents": rng.standard_normal((1, grid * grid, cfg.in_channels), dtype=np.float32).astype(DType.BF16.np),
        "text_features": rng.standard_normal((1, n_txt, cfg.joint_attention_dim), dtype=np.float32).astype(
            DType.BF16.np
        ),
        "timestep_proj": flux2_timestep_proj([900.0], dtype=DType.BF16),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    r: dict[str, Any] = {"tokens": {"image": grid * grid, "text": n_txt}, "nodes": len(program.nodes)}
    res["sizes"][str(size)] = r

    be = ref_dev.backend()
    t0 = time.perf_counter()
    exe = be.prepare(program, plan_program(program, be.profile(), be.budget()), weights)
    ref = exe.run(inputs)[program.outputs[0]]
    r["cuda_prepare_and_first_run_s"] = round(time.perf_counter() - t0, 2)
    ms, _ = ref_dev.dif_median(exe, inputs, 10, 3)
    r["cuda_ms"] = round(ms, 2)
    r["cuda_run_wall_ms"] = round(wall_median(lambda: exe.run(inputs), 3)[0], 2)
    r["cuda"] = ref_dev.describe(exe)
    exe = None
    gc.collect()
    print(f"[{size}] cuda {r['cuda_ms']} ms (run() wall {r['cuda_run_wall_ms']} ms)", flush=True)
    save()

    t0 = time.perf_counter()
    oexe = ocl.prepare(program, plan_program(program, ocl.profile(), ocl.budget()), weights)
    r["opencl_prepare_s"] = round(time.perf_counter() - t0, 2)
    r["opencl_launches"] = oexe.launches
    t0 = time.perf_counter()
    got = oexe.run(inputs)[program.outputs[0]]
    first = time.perf_counter() - t0
    r["opencl_first_run_s"] = round(first, 2)
    r["finite"] = bool(np.isfinite(got.astype(np.float32)).all())
    r["cosine_vs_cuda"] = cosine(got, ref)
    r["rel_l2_vs_cuda"] = rel_l2(got, ref)
    print(f"[{size}] opencl first run {first:.2f} s, cosine vs cuda {r['cosine_vs_cuda']:.6f}, "
          f"rel-L2 {r['rel_l2_vs_cuda']:.2e}", flush=True)  # fmt: skip
    save()
    left = deadline - time.perf_counter() - reserve(first, grid * grid, args)
    n = max(0, min(args.runs, int(left / max(first, 1e-3))))
    if n:
        ms, times = wall_median(lambda: oexe.run(inputs), n)
        r["opencl_ms"] = round(ms, 2)
        r["opencl_times_ms"] = [round(t, 1) for t in times]
    else:
        r["opencl_ms"] = round(first * 1e3, 2)
        r["opencl_ms_note"] = "first run only (time box): includes one-time kernel builds"
    r["opencl_vs_cuda_time_ratio"] = round(r["opencl_ms"] / max(r["cuda_ms"], 1e-9), 1)
    print(f"[{size}] opencl {r['opencl_ms']} ms over {n} runs", flush=True)
    save()
    if args.profile and ocl.profiling and not res.get("opencl_profile") and deadline - time.perf_counter() > 2 * first:
        _, per_node = oexe.run_profiled(inputs)
        ops: Counter[str] = Counter()
        nodes = program.node_by_id
        for node_id, secs in per_node.items():
            ops[nodes[node_id].op] += secs * 1e3
        res["opencl_profile"] = {"size": size, "device_ms_by_op": {k: round(v, 2) for k, v in ops.most_common()}}
        save()
    oexe.close()
    oexe = None
    gc.collect()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="OpenCL device: 'P:D' or a name substring (NVIDIA)")
    ap.add_argument("--reference", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--sizes", default="512,1024")
    ap.add_argument("--runs", type=int, default=5, help="timed OpenCL runs at most")
    ap.add_argument("--deadline-s", type=float, default=140.0, help="time box of the whole script")
    ap.add_argument("--reserve-s", type=float, default=10.0, help="kept back from timed runs, beyond later sizes")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--host-eval-max-bytes", type=int, default=None, help="OpenCL host evaluation (None: its default)")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--conformance", default=None, help="JSON of perf/opencl_conformance.py to embed")
    ap.add_argument("--out", default="perf/results/opencl_h200_klein4b.json")
    args = ap.parse_args()
    deadline = time.perf_counter() + args.deadline_s
    from dif_backend_opencl.device import OpenCLBackend
    from dif_frontend_flux2.config import Flux2TransformerConfig

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"model": "flux2-klein-4b", "platforms": platforms(), "sizes": {}}

    def save() -> None:
        out.write_text(json.dumps(res, indent=1))

    if args.conformance and Path(args.conformance).exists():
        res["opencl_conformance"] = json.loads(Path(args.conformance).read_text())
    config = (TINY if args.tiny else CONFIGS)["klein-4b"]
    res["config"] = config
    cfg = Flux2TransformerConfig.from_dict(config)
    ref_dev = Device(args.reference)
    ocl = OpenCLBackend(args.device, profiling=args.profile, host_eval_max_bytes=args.host_eval_max_bytes)
    res["opencl_device"] = {
        "name": ocl.info.name,
        "platform": ocl.info.platform,
        "kind": ocl.info.kind,
        "host_eval_max_bytes": ocl.host_eval_max_bytes,
        "profile": ocl.profile().to_dict(),
    }
    res["reference"] = ref_dev.name() + f" (dif {args.reference} backend)"
    save()
    from dif_frontend_flux2.model import build_transformer

    t0 = time.perf_counter()
    shapes = build_transformer(cfg, batch=1, n_img=16, n_txt=8, dtype=DType.BF16)  # params do not depend on tokens
    weights = random_weights(shapes, ref_dev.torch_device)
    res["weights_gib"] = round(sum(w.nbytes for w in weights.values()) / 2**30, 2)
    res["weights_s"] = round(time.perf_counter() - t0, 1)
    ref_dev.empty_cache()
    save()
    for size in (int(s) for s in args.sizes.split(",")):
        args.current = size
        one_size(size, args, cfg, weights, ref_dev, ocl, deadline, res, save)
    head = ("size", 6), ("tokens", 7), ("CUDA graph ms", 14), ("CUDA run() ms", 14), ("OpenCL ms", 10), ("cosine", 9)
    print("\n" + " ".join(f"{h:>{w}}" for h, w in head) + f" {'rel-L2':>9}")
    for size, r in res["sizes"].items():
        print(
            f"{size:>6} {r['tokens']['image']:>7} {r.get('cuda_ms', float('nan')):>14.2f} "
            f"{r.get('cuda_run_wall_ms', float('nan')):>14.2f} {r.get('opencl_ms', float('nan')):>10.1f} "
            f"{r.get('cosine_vs_cuda', float('nan')):>9.6f} {r.get('rel_l2_vs_cuda', float('nan')):>9.2e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
