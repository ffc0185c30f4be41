"""MiniMax-H3 DiT: one full-size forward at the default canvas, diffusers eager vs dif (CUDA backend), same run.

Default canvas (opset notes §1.4 / §4): 768x1344, 124 frames -> 37 latent frames x 1008 rows, 2 x 207 audio rows,
256 text rows: 37,966 rows; t2va timesteps t_v = 0.3, t_a = 0.5 (two AdaLN slots). Seeded random bf16 weights
(diffusers' init, fp32 `_keep_in_fp32_modules`, constant tensors perturbed: perf/denoiser_models.make_model),
66 GB; dif binds diffusers' state dict by name, copied device to device (perf/dif_device_bridge.py). The order
keeps one copy resident at a time where it can: diffusers runs first (time, peak memory, outputs to the host),
dif prepares from the diffusers tensors (both copies on the device for the prepare: 2 x 61.7 GiB), then the
torch model is freed before dif is timed. `--host-weights` instead moves the torch weights to host memory
first and dif uploads from there (never two device copies; ~66 GB of host RAM).

Reported: diffusers ms (CUDA events, median), peak GiB; dif ms, device GiB, plan arena; cosine / rel-L2 of dif
vs diffusers on both outputs (video rows, audio rows). Goal: dif <= 5,500 ms bf16 (diffusers eager measured at
6,561 ms, peak 67.9 GiB in the notes).

Usage (GPU machine, repo root):   python3 perf/h3_dit_forward.py --iters 3
Check the script on a CPU:         python3 perf/h3_dit_forward.py --device cpu --tiny
Writes perf/results/h3_dit_forward.json (and into $OUT when set; --tiny only into $OUT).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from denoiser_models import perturb_constants, to_numpy  # noqa: E402
from dif_device_bridge import Device  # noqa: E402

from dif.dtypes import DType  # noqa: E402
from dif.passes import optimize  # noqa: E402
from dif.plan.planner import plan_program  # noqa: E402
from dif_frontend_h3.config import H3TransformerConfig, load_configs  # noqa: E402
from dif_frontend_h3.configs import published  # noqa: E402
from dif_frontend_h3.layout import build_layout  # noqa: E402
from dif_frontend_h3.model import build_denoiser, rope_tables, time_proj  # noqa: E402

TINY = dict(
    num_attention_heads=2, attention_head_dim=32, hidden_size=48, num_layers=2, num_refiner_layers=1, ffn_dim=64,
    text_dim=16, freq_dim=32, time_embed_hidden_dim=40, time_embed_dim=24, rope_freq_dim=4,
)  # fmt: skip
T_VIDEO, T_AUDIO = 0.3, 0.5


def make_reference(config: dict[str, Any], device: str, seed: int) -> Any:
    """MiniMaxH3Transformer3DModel with seeded random weights built directly in bf16 (an fp32 build of 33B
    parameters would need 132 GB of device memory first), the `_keep_in_fp32_modules` cast to fp32 as
    from_pretrained keeps them, constant tensors perturbed (`denoiser_models.perturb_constants`)."""
    import torch
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = MiniMaxH3Transformer3DModel.from_config(config).eval()
    finally:
        torch.set_default_dtype(default)
    keep = list(model._keep_in_fp32_modules or [])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name.split(".") for k in keep):
                p.data = p.data.float()
        model.rope.inv_freq.data = model.rope.inv_freq.data.float()
    perturb_constants(model, device, seed + 1)
    return model


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a miniature DiT and canvas (script check on a CPU)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--host-weights", action="store_true", help="hand dif host copies (one device copy at a time)")
    ap.add_argument("--no-passes", action="store_true", help="plan the unoptimized program")
    ap.add_argument("--text-len", type=int, default=256)
    ap.add_argument("--frames", type=int, default=124)
    ap.add_argument("--width", type=int, default=1344)
    ap.add_argument("--height", type=int, default=768)
    args = ap.parse_args(argv)
    import torch

    torch.set_grad_enabled(False)
    dev = Device(args.device)
    config = json.loads((published("h3") / "transformer" / "config.json").read_text())
    if args.tiny:
        config.update(TINY)
        args.text_len, args.frames, args.width, args.height = 7, 22, 128, 96
    cfg = H3TransformerConfig.from_dict(config)
    geo = load_configs(published("h3"))
    t_lat = (args.frames - 5) // 17 * 5 + 2
    n_audio = int(round(args.frames / 24 * 40))
    layout = build_layout(np.ones(args.text_len, np.int64), t_lat, args.height // 16, args.width // 16, n_audio)
    out: dict[str, Any] = {"device": dev.name(), "rows": layout.seq_len, "text_rows": layout.text_len,
                           "video_rows": layout.video_rows, "audio_rows": layout.audio_rows,
                           "canvas": f"{args.width}x{args.height}x{args.frames}", "tiny": args.tiny}  # fmt: skip
    assert geo.video_vae.spatial_ratio == 16
    rng = np.random.default_rng(0)
    video = rng.standard_normal((1, layout.video_rows, cfg.video_patch_dim), dtype=np.float32)
    audio = rng.standard_normal((1, layout.audio_rows, cfg.audio_in_channels), dtype=np.float32)
    text = rng.standard_normal((1, layout.text_len, cfg.text_dim), dtype=np.float32).astype(DType.BF16.np)
    slot_t = layout.row_timesteps(T_VIDEO, T_AUDIO)

    # -- diffusers --------------------------------------------------------------------------------------
    t0 = time.perf_counter()
    model = make_reference(config, dev.torch_device, seed=0)
    out["diffusers_build_s"] = round(time.perf_counter() - t0, 1)
    td = dev.torch_device
    uniq, inverse = np.unique(slot_t[layout.slots], return_inverse=True)
    kw = dict(
        hidden_states=torch.from_numpy(video).to(td), audio_hidden_states=torch.from_numpy(audio).to(td),
        encoder_hidden_states=torch.from_numpy(text.astype(np.float32)).to(td, torch.bfloat16),
        timestep=torch.from_numpy(uniq.astype(np.float32)).to(td), timestep_indices=torch.from_numpy(inverse).to(td),
        token_tags=torch.from_numpy(layout.tags).to(td), position_ids=torch.from_numpy(layout.position_ids).to(td),
        video_indices=torch.from_numpy(layout.video_indices).to(td),
        audio_indices=torch.from_numpy(layout.audio_indices).to(td),
        text_indices=torch.from_numpy(layout.text_indices).to(td), return_dict=False,
    )  # fmt: skip
    dev.reset_peak()
    ref_v, ref_a = (to_numpy(x).astype(np.float32) for x in model(**kw))
    ms, times = dev.torch_median(lambda: model(**kw), args.iters, args.warmup)
    out["diffusers"] = {"ms": round(ms, 1), "times_ms": [round(t, 1) for t in times], "peak_gib": dev.peak_gib()}
    print(f"diffusers eager: {ms:.1f} ms, peak {out['diffusers']['peak_gib']} GiB", flush=True)
    kw.clear()
    gc.collect()
    dev.empty_cache()

    # -- dif --------------------------------------------------------------------------------------------
    backend = dev.backend()
    program = build_denoiser(cfg, layout, dtype="bf16")
    t0 = time.perf_counter()
    profile = backend.profile()
    if not args.no_passes:
        program, _ = optimize(program, target=profile)
    if args.host_weights:
        model = model.to("cpu")
        dev.empty_cache()
    plan = plan_program(program, profile, backend.budget())
    res: dict[str, Any] = {
        "plan_s": round(time.perf_counter() - t0, 1), "arena_gib": round(plan.arena_bytes / 2**30, 2),
        "params_gib": round(plan.param_bytes / 2**30, 2), "nodes": len(program.nodes),
    }  # fmt: skip
    weights = dev.weights(program, model) if not args.host_weights else {
        p.name: to_numpy(model.state_dict()[p.name]) for p in program.params}  # fmt: skip
    t0 = time.perf_counter()
    with dev.bridge():
        exe = backend.prepare(program, plan, weights)
    res["prepare_s"] = round(time.perf_counter() - t0, 1)
    weights, model = {}, None  # the torch copy goes before dif is timed
    gc.collect()
    dev.empty_cache()
    cos, sin = rope_tables(cfg, layout.position_ids, dtype="bf16")
    inputs = {"video_latents": video, "audio_latents": audio, "text_embeds": text,
              "time_proj": time_proj(slot_t, cfg.freq_dim), "rope_cos": cos, "rope_sin": sin}  # fmt: skip
    free0 = dev.free_bytes()
    t0 = time.perf_counter()
    got = exe.run(inputs)
    res["first_run_s"] = round(time.perf_counter() - t0, 2)
    got_v, got_a = (np.asarray(got[o], np.float32) for o in program.outputs)
    for name, g, r in (("video", got_v, ref_v), ("audio", got_a, ref_a)):
        res[f"{name}_cosine"], res[f"{name}_rel_l2"] = round(cosine(g, r), 6), round(rel_l2(g, r), 6)
    ms, times = dev.dif_median(exe, inputs, args.iters, args.warmup)
    res.update({"ms": round(ms, 1), "times_ms": [round(t, 1) for t in times]})
    res["device_free_gib_after_prepare"] = round(free0 / 2**30, 2) if free0 else None
    res.update(dev.describe(exe))
    out["dif"] = res
    out["dif_over_diffusers"] = round(res["ms"] / out["diffusers"]["ms"], 3)
    print(f"dif: {ms:.1f} ms (x{out['dif_over_diffusers']} of diffusers); cosine video {res['video_cosine']} "
          f"audio {res['audio_cosine']}", flush=True)  # fmt: skip
    dests = [] if args.tiny else [Path(__file__).resolve().parent / "results"]  # a miniature is not a result
    dests += [Path(os.environ["OUT"])] if os.environ.get("OUT") else []
    name = "h3_dit_forward_tiny.json" if args.tiny else "h3_dit_forward.json"
    for d in dests:
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
