"""SD-Turbo on the H200: the UNet at 512x512 (one step) and prompt -> image, dif vs diffusers, and the same
prompt -> image through OpenCL (NVIDIA's platform) with a stage split. Issue 21's numbers, in one call.

Full-size random weights from the published configs packaged with dif-frontend-sdturbo (UNet 866M, CLIP-H
text 340M, AutoencoderKL 84M, TAESD 2.4M): diffusers' seeded init, constant tensors perturbed
(perf/denoiser_models.py). dif reads the same torch tensors by state-dict name (`TorchSource`, copied device
to device on CUDA; host copies for OpenCL). The tokenizer is the embedded demo checkpoint's small CLIP BPE
(the real 49k vocabulary is not on the machine; every id it makes is a valid CLIP-H id).
Phases (JSON after each, into perf/results/sdturbo_<device>.json and --out-dir):
  unet      per dtype (f16, bf16): diffusers eager, torch.compile (--compile; compile seconds), dif CUDA graph
            replay (CUDA-event medians after warm-up); cosine / rel-L2 of dif vs eager; dif's time by op.
            Goals: <= 12 ms, cosine >= 0.999 (diffusers eager 38.5 ms, compile 17.9 ms on this machine).
  pipeline  prompt -> image 512x512, 1 step, guidance 0, f16: diffusers StableDiffusionPipeline (KL VAE, and
            with AutoencoderTiny) vs dif's SdPipeline on CUDA (KL VAE, --fast-vae TAESD), same initial noise;
            wall medians and dif's stage split; pixels vs diffusers (mean / max |diff| on 0-255).
            Goals: <= 25 ms full VAE, <= 12 ms TAESD (diffusers ~68 ms eager).
  opencl    (--opencl) the same dif pipeline on backend "opencl" (f32 and f16): wall, stage split
            (encode = CLIP, denoise = UNet, decode = VAE), pixels vs dif CUDA at the same dtype (the seed
            document's bar: mean < 0.05, max <= 1); the seed's RTX 4090 figure: 2.96 s (CLIP 313 ms,
            UNet 1,228 ms, VAE 1,416 ms).
Usage (GPU machine, repo root; diffusers + torch present; NVIDIA OpenCL ICD written first for --opencl):
    mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
    python3 perf/bench_sdturbo.py --device cuda --compile --opencl --deadline-s 540 --out-dir $OUT
Check on a CPU (miniature, CPU backend for "cuda"; OpenCL if a platform builds kernels):
    python3 perf/bench_sdturbo.py --device cpu --tiny --dtypes f32 --pipeline-dtype f32 --out-dir /tmp/sdb
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from denoiser_models import perturb_constants, to_numpy, to_torch  # noqa: E402
from dif_device_bridge import Device  # noqa: E402
from pipeline_wall import TorchSource  # noqa: E402

from dif.dtypes import DType  # noqa: E402
from dif.image_pipeline import ImageRequest  # noqa: E402
from dif.passes import optimize  # noqa: E402
from dif.plan.planner import plan_program  # noqa: E402
from dif_frontend_sdturbo import DEFAULT_CHECKPOINT  # noqa: E402
from dif_frontend_sdturbo.config import TaesdConfig, load_configs  # noqa: E402
from dif_frontend_sdturbo.configs import published, taesd_config  # noqa: E402
from dif_frontend_sdturbo.pipeline import SdPipeline  # noqa: E402
from dif_frontend_sdturbo.unet import build_unet, timestep_features  # noqa: E402
from dif_frontend_sdturbo.weights import SdCheckpoint, Taesd  # noqa: E402

T_START = time.perf_counter()
PROMPT = "a photograph of a red fox sitting in fresh snow at golden hour, shallow depth of field"
SEED_4090 = {"total_ms": 2960, "clip_ms": 313, "unet_ms": 1228, "vae_ms": 1416}
TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}
TINY = {  # structurally complete miniatures of the four configs (--tiny)
    "unet": dict(block_out_channels=[32, 64, 64], attention_head_dim=[2, 4, 4], cross_attention_dim=32,
                 norm_num_groups=8, sample_size=16,
                 down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
                 up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]),
    "text_encoder": dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2),
    "vae": dict(block_out_channels=[16, 32, 32, 32], layers_per_block=1, norm_num_groups=8),
    "taesd": dict(decoder_block_out_channels=[16] * 4, encoder_block_out_channels=[16] * 4),
}  # fmt: skip


def left(args: argparse.Namespace) -> float:
    return args.deadline_s - (time.perf_counter() - T_START)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a64 @ b64 / max(np.linalg.norm(a64) * np.linalg.norm(b64), 1e-300))


def pixel_diff(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    d = np.abs(a.astype(np.int32) - b.astype(np.int32))
    return {
        "mean_abs": round(float(d.mean()), 4),
        "max_abs": int(d.max()),
        "seed_bar_ok": bool(d.mean() < 0.05 and d.max() <= 1),
    }


def median_ms(times: list[float]) -> float:
    return round(float(np.median(times)), 3)


# -- models --------------------------------------------------------------------------------------------


def configs(tiny: bool) -> dict[str, dict[str, Any]]:
    root = published("sd-turbo")
    out = {k: json.loads((root / k / "config.json").read_text()) for k in ("unet", "text_encoder", "vae")}
    out["taesd"] = json.loads(taesd_config().read_text())
    if tiny:
        for k, v in TINY.items():
            out[k] = {**out[k], **v}
        out["text_encoder"]["vocab_size"] = 49408
    return out


def build_models(cfgs: dict[str, dict[str, Any]], device: str, dtype: str, seed: int = 0) -> dict[str, Any]:
    """The four torch modules in `dtype` on `device`, seeded init, constant tensors perturbed."""
    import diffusers
    import torch
    import transformers

    tdt = getattr(torch, TORCH_DTYPES[dtype])
    torch.manual_seed(seed)
    with torch.device(device):
        models = {
            "unet": diffusers.UNet2DConditionModel.from_config(cfgs["unet"]),
            "text_encoder": transformers.CLIPTextModel(transformers.CLIPTextConfig(**cfgs["text_encoder"])),
            "vae": diffusers.AutoencoderKL.from_config(cfgs["vae"]),
            "taesd": diffusers.AutoencoderTiny.from_config(cfgs["taesd"]),
        }
    for i, m in enumerate(models.values()):
        m.to(tdt).eval().requires_grad_(False)
        perturb_constants(m, device, seed + 1 + i)
    return models


def dif_checkpoint(models: dict[str, Any], dev: Device, tiny: bool) -> SdCheckpoint:
    """An SdCheckpoint over the torch modules (configs: the packaged sd-turbo folder, or the miniature's)."""
    root = published("sd-turbo")
    cfgs = load_configs(root)
    if tiny:
        from dif_frontend_sdturbo.config import ClipTextConfig, UNetConfig, VaeConfig

        full = configs(True)
        cfgs = type(cfgs)(
            ClipTextConfig.from_dict(full["text_encoder"]), UNetConfig.from_dict(full["unet"]),
            VaeConfig.from_dict(full["vae"]), cfgs.scheduler, cfgs.kind,
        )  # fmt: skip
    src = {k: TorchSource(models[k], dev, f"torch:{k}") for k in ("text_encoder", "unet", "vae", "taesd")}
    width = models["taesd"].decoder.layers[0].weight.shape[0]
    tcfg = TaesdConfig.from_dict({**json.loads(taesd_config().read_text()), "decoder_block_out_channels": [width] * 4})
    return SdCheckpoint(
        root, "sd-turbo (random)", cfgs, DEFAULT_CHECKPOINT / "tokenizer", src["text_encoder"], src["unet"],
        src["vae"], Taesd(tcfg, src["taesd"], "taesd (random)"),
    )  # fmt: skip


# -- phase 1: the UNet -------------------------------------------------------------------------------------


def bench_unet(args: argparse.Namespace, dev: Device, cfgs: dict[str, Any], dtype: str) -> dict[str, Any]:
    import torch

    models = build_models(cfgs, dev.torch_device, dtype)
    unet = models["unet"]
    ucfg = load_configs(published("sd-turbo")).unet if not args.tiny else dif_checkpoint(models, dev, True).configs.unet
    h = w = args.size // 8
    rng = np.random.default_rng(0)
    sample = rng.standard_normal((1, 4, h, w)).astype(DType(dtype).np)
    text = rng.standard_normal((1, 77, ucfg.cross_attention_dim)).astype(DType(dtype).np)
    t = np.array([999.0], np.float32)
    ts, tt = to_torch(sample, dev.torch_device), to_torch(text, dev.torch_device)
    tstep = torch.tensor(t, device=dev.torch_device)
    out: dict[str, Any] = {"dtype": dtype, "size": args.size}
    with torch.no_grad():
        eager = lambda: unet(ts, tstep, encoder_hidden_states=tt).sample  # noqa: E731
        ref = to_numpy(eager())
        out["diffusers_eager_ms"], _ = dev.torch_median(eager, args.iters, 3)
        if args.compile and left(args) > 150:
            compiled = torch.compile(unet)
            t0 = time.perf_counter()
            compiled(ts, tstep, encoder_hidden_states=tt)
            dev.sync()
            out["compile_s"] = round(time.perf_counter() - t0, 1)
            out["diffusers_compile_ms"], _ = dev.torch_median(
                lambda: compiled(ts, tstep, encoder_hidden_states=tt), args.iters, 3
            )
            del compiled
    program = build_unet(ucfg, latent_h=h, latent_w=w, dtype=dtype)
    backend = dev.backend()
    n0 = len(program.nodes)
    program, decisions = optimize(program, target=backend.profile())
    fused = {d.pass_name: 0 for d in decisions}
    for d in decisions:
        fused[d.pass_name] += d.verdict == "applied"
    plan = plan_program(program, backend.profile(), backend.budget())
    weights = dev.weights(program, unet)
    t0 = time.perf_counter()
    with dev.bridge():
        exe = backend.prepare(program, plan, weights)
    out["dif_prepare_s"] = round(time.perf_counter() - t0, 2)
    inputs = {"sample": sample, "timestep_proj": timestep_features(ucfg, t).astype(DType(dtype).np), "text": text}
    got = exe.run(inputs)[program.outputs[0]]
    out.update({"cosine": round(cosine(got, ref), 6), "rel_l2": round(rel_l2(got, ref), 6)})
    ms, times = dev.dif_median(exe, inputs, args.iters, 3)
    out.update({"dif_ms": round(ms, 3), "dif_times_ms": [round(x, 3) for x in times]})
    out.update({"nodes": len(program.nodes), "nodes_before_passes": n0, "fusions_applied": fused})
    out.update(dev.describe(exe))
    if dev.kind == "cuda" and args.profile_iters:
        try:
            out["dif_by_op_ms"] = dev.profile(exe, args.profile_iters)
        except Exception as exc:  # noqa: BLE001 - a profile is a bonus
            out["profile_error"] = f"{type(exc).__name__}: {exc}"[:500]
    out["goal_ms"], out["goal_cosine"] = 12.0, 0.999
    del exe, weights, models
    gc.collect()
    dev.empty_cache()
    return out


# -- phases 2 and 3: prompt -> image ---------------------------------------------------------------------------


def diffusers_pipeline(models: dict[str, Any], fast: bool) -> Any:
    import diffusers
    import transformers

    scheduler = diffusers.EulerDiscreteScheduler.from_config(
        json.loads((published("sd-turbo") / "scheduler" / "scheduler_config.json").read_text())
    )
    pipe = diffusers.StableDiffusionPipeline(
        vae=models["taesd"] if fast else models["vae"], text_encoder=models["text_encoder"],
        tokenizer=transformers.CLIPTokenizer.from_pretrained(DEFAULT_CHECKPOINT / "tokenizer"), unet=models["unet"],
        scheduler=scheduler, safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


def time_diffusers(args: argparse.Namespace, dev: Device, pipe: Any, noise: Any) -> tuple[dict[str, Any], np.ndarray]:
    import torch

    kw = dict(num_inference_steps=1, guidance_scale=0.0, latents=noise, height=args.size, width=args.size)

    def once() -> np.ndarray:
        with torch.no_grad():
            return pipe(PROMPT, output_type="np", **kw).images[0]

    image = once()
    walls = []
    for _ in range(args.iters):
        dev.sync()
        t0 = time.perf_counter()
        once()
        dev.sync()
        walls.append((time.perf_counter() - t0) * 1e3)
    return {"wall_ms": median_ms(walls), "walls_ms": [round(x, 2) for x in walls]}, np.round(image * 255).astype(
        np.uint8
    )


def time_dif(args: argparse.Namespace, dev: Device, ck: SdCheckpoint, backend: str, dtype: str, fast: bool,
             noise: np.ndarray, runs: int, one_program: bool = True) -> tuple[dict[str, Any], np.ndarray]:  # fmt: skip
    """prompt -> image walls of dif's pipeline; `one_program` False keeps the three stage programs apart."""
    pipe = SdPipeline(ck, dtype=DType(dtype), backend=backend, fast_vae=fast, one_program=one_program)
    req = ImageRequest(PROMPT, seed=0, width=args.size, height=args.size, init_noise=noise.astype(DType(dtype).np))
    t0 = time.perf_counter()
    with dev.bridge() if backend == "cuda" else _nothing():
        first = pipe.generate(req)
    out: dict[str, Any] = {"first_run_s": round(time.perf_counter() - t0, 2), "first_timings_s": first.timings}
    walls, stages = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        run = pipe.generate(req)
        walls.append((time.perf_counter() - t0) * 1e3)
        stages.append({k: v * 1e3 for k, v in run.timings.items()})
    out["wall_ms"], out["walls_ms"] = median_ms(walls), [round(x, 2) for x in walls]
    keys = sorted({k for s in stages for k in s})
    out["stages_ms"] = {k: median_ms([s.get(k, 0.0) for s in stages]) for k in keys}
    out["plan_peak_bytes"] = pipe.plan_peak_bytes
    if backend == "cuda":  # the decode stage alone: the decoder program, its 8-bit pixels made on the device
        g = args.size // 8
        z = np.random.default_rng(1).standard_normal((1, g * g, 4)).astype(DType(dtype).np)
        decode_ms = []
        for _ in range(runs):
            t0 = time.perf_counter()
            pipe.decode(z, g, g)
            decode_ms.append((time.perf_counter() - t0) * 1e3)
        out["decode_ms"] = median_ms(decode_ms)
    if backend == "cuda":  # each program's device time alone (graph replay between events): the rest is host
        out["graph_ms"] = {
            name: round(dev.dif_median(exe, {}, runs, 3)[0], 3) for name, exe in pipe._programs.prepared().items()
        }
        out["host"] = host_profile(pipe, req, runs)
    if backend == "cuda" and args.profile_iters:  # where each stage's device time goes, by shape
        out["profile_by_shape"] = {
            name: dict(list(dev.profile(exe, args.profile_iters, by="shape").items())[: args.profile_top])
            for name, exe in pipe._programs.prepared().items()
        }
    return out, run.pixels


def host_profile(pipe: Any, req: ImageRequest, runs: int) -> dict[str, Any]:
    """Where prompt -> image spends time outside the device: each program's `run` (inputs up, graph, outputs
    down) and `execute` + synchronize against its graph time, and the functions with the most own time over
    `runs` whole generates (cProfile)."""
    import cProfile
    import pstats

    import cupy

    def wall_ms(fn: Any) -> float:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return median_ms(times)

    per_program = {}
    for name, exe in pipe._programs.prepared().items():
        inputs = {v.name: exe.in_host[v.name].copy() for v in exe.program.inputs}
        stream = exe.backend.stream
        per_program[name] = {
            "run_ms": wall_ms(lambda exe=exe, inputs=inputs: exe.run(inputs)),
            "execute_sync_ms": wall_ms(lambda exe=exe, stream=stream: (exe.execute(), stream.synchronize())),
            "steps": len(exe.steps),
        }
    cupy.cuda.runtime.deviceSynchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(runs):
        pipe.generate(req)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:40]  # (file, line, fn) -> (cc, nc, tt, ct, ..)
    top = [{"fn": f"{Path(f).name}:{line}({fn})", "calls": nc, "own_ms": round(tt / runs * 1e3, 4),
            "cum_ms": round(ct / runs * 1e3, 4)} for (f, line, fn), (_cc, nc, tt, ct, _callers) in rows]  # fmt: skip
    return {"programs": per_program, "top_own_per_generate": top}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def bench_pipeline(args: argparse.Namespace, dev: Device, cfgs: dict[str, Any], results: dict[str, Any],
                   save: Any) -> None:  # fmt: skip
    import torch

    dtype = args.pipeline_dtype
    models = build_models(cfgs, dev.torch_device, dtype)
    h = w = args.size // 8
    noise_np = np.random.default_rng(7).standard_normal((1, 4, h, w)).astype(np.float32)
    noise = torch.from_numpy(noise_np).to(dev.torch_device, getattr(torch, TORCH_DTYPES[dtype]))
    ck = dif_checkpoint(models, dev, args.tiny)
    dif_backend = "cuda" if dev.kind == "cuda" else "cpu"
    pipe_out: dict[str, Any] = results.setdefault("pipeline", {"dtype": dtype, "size": args.size})
    images: dict[str, np.ndarray] = {}
    for fast in (False, True):
        name = "taesd" if fast else "kl_vae"
        ref, ref_img = time_diffusers(args, dev, diffusers_pipeline(models, fast), noise)
        got, img = time_dif(args, dev, ck, dif_backend, dtype, fast, noise_np, args.iters)
        got["pixels_vs_diffusers"] = pixel_diff(img, ref_img)
        got["cosine_vs_diffusers"] = round(cosine(img, ref_img), 6)
        apart, apart_img = time_dif(args, dev, ck, dif_backend, dtype, fast, noise_np, args.iters, one_program=False)
        apart["pixels_vs_one_program"] = pixel_diff(apart_img, img)
        images[name] = img
        pipe_out[name] = {"diffusers": ref, "dif": got, "dif_stages_apart": apart, "goal_ms": 12.0 if fast else 25.0}
        save()
    if args.opencl and left(args) > 60:
        ocl: dict[str, Any] = results.setdefault("opencl", {"seed_rtx4090": SEED_4090})
        host = Device("cpu")
        host_ck = dif_checkpoint(models, host, args.tiny)  # OpenCL reads host arrays
        for odt in args.opencl_dtypes.split(","):
            for fast in (False, True):
                key = f"{odt}_{'taesd' if fast else 'kl_vae'}"
                if left(args) < 45:
                    ocl[key] = {"skipped": f"{left(args):.0f} s left before --deadline-s"}
                    continue
                try:
                    got, img = time_dif(args, host, host_ck, "opencl", odt, fast, noise_np, args.opencl_runs)
                    if odt == dtype:
                        ref_img = images["taesd" if fast else "kl_vae"]
                    else:  # the CUDA image at this dtype, for the seed's validation bar
                        at_dtype = dif_checkpoint(build_models(cfgs, dev.torch_device, odt), dev, args.tiny)
                        ref_img = time_dif(args, dev, at_dtype, dif_backend, odt, fast, noise_np, 1)[1]
                    got["pixels_vs_dif_" + dif_backend] = pixel_diff(img, ref_img)
                    ocl[key] = got
                except Exception as exc:  # noqa: BLE001 - record and go on: the other results must come back
                    ocl[key] = {"error": f"{type(exc).__name__}: {exc}"[:1500]}
                save()


# -- driver ----------------------------------------------------------------------------------------------------


def table(results: dict[str, Any]) -> None:
    print("\nSD-Turbo", results["env"]["device"])
    for r in results.get("unet", []):
        print(f"  UNet {r['size']}^2 {r['dtype']}: dif {r.get('dif_ms')} ms (goal 12) | diffusers eager "
              f"{r.get('diffusers_eager_ms', 0):.2f} ms, compile {r.get('diffusers_compile_ms', 'n/a')} ms | cosine "
              f"{r.get('cosine')}")  # fmt: skip
    p = results.get("pipeline", {})
    for name in ("kl_vae", "taesd"):
        if name in p:
            d, ref, apart = p[name]["dif"], p[name]["diffusers"], p[name].get("dif_stages_apart", {})
            print(f"  prompt->image {name}: dif {d['wall_ms']} ms {d['stages_ms']} (stages apart "
                  f"{apart.get('wall_ms')} ms) | diffusers {ref['wall_ms']} ms | "
                  f"pixels {d['pixels_vs_diffusers']}")  # fmt: skip
    for key, r in results.get("opencl", {}).items():
        if key != "seed_rtx4090":
            print(f"  opencl {key}: {r.get('wall_ms', r.get('error', r.get('skipped')))} ms {r.get('stages_ms', '')} "
                  f"{ {k: v for k, v in r.items() if k.startswith('pixels')} }")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="miniature configs (check the script on a CPU)")
    ap.add_argument("--dtypes", default="f16,bf16", help="UNet phase dtypes")
    ap.add_argument("--pipeline-dtype", default="f16")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--compile", action="store_true", help="also time the UNet under torch.compile")
    ap.add_argument("--opencl", action="store_true", help="the dif pipeline through backend 'opencl' too")
    ap.add_argument("--opencl-dtypes", default="f32,f16")
    ap.add_argument("--opencl-runs", type=int, default=3)
    ap.add_argument("--profile-iters", type=int, default=3)
    ap.add_argument("--profile-top", type=int, default=15, help="shapes listed per pipeline program")
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: unet, pipeline")
    ap.add_argument("--deadline-s", type=float, default=540.0)
    ap.add_argument("--out-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.tiny and args.size == 512:
        args.size = 64
    dev = Device(args.device)
    results: dict[str, Any] = {"env": {"device": dev.name(), "python": platform.python_version(), "argv": sys.argv[1:]}}
    name = f"sdturbo_{args.device}{'_tiny' if args.tiny else ''}.json"
    dests = ([] if args.tiny else [Path(__file__).resolve().parent / "results" / name]) + (
        [args.out_dir / name] if args.out_dir else []
    )

    def save() -> None:
        for d in dests:
            d.parent.mkdir(parents=True, exist_ok=True)
            tmp = d.with_suffix(".tmp")
            tmp.write_text(json.dumps(results, indent=2, default=str))
            tmp.replace(d)

    cfgs = configs(args.tiny)
    skip = set(filter(None, args.skip.split(",")))
    if "unet" not in skip:
        for dtype in args.dtypes.split(","):
            try:
                results.setdefault("unet", []).append(bench_unet(args, dev, cfgs, dtype))
            except Exception as exc:  # noqa: BLE001 - record, go on
                results.setdefault("unet", []).append({"dtype": dtype, "error": f"{type(exc).__name__}: {exc}"[:1500]})
            save()
    if "pipeline" not in skip:
        bench_pipeline(args, dev, cfgs, results, save)
    results["elapsed_s"] = round(time.perf_counter() - T_START, 1)
    save()
    table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
