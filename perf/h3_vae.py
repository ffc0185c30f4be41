"""MiniMax-H3 VAEs on the GPU: diffusers vs dif (CUDA backend) in the same run, full-size random weights.

Video decoder (bf16, fp32 norms / scales as diffusers' `_keep_in_fp32_modules`): one 7 x 16 x 16 latent tile
(1,797 tokens; the default canvas decodes 196 of them) timed, then a whole chunked + tiled decode of
`--frames` at `--height` x `--width` compared end to end (RGB in [0, 1]). Keyframe encoder (fp32): one
frame at the canvas size, tiled 256 px, moments compared. Audio decoder (fp32 pinned): `--frames` of
stereo audio (round(frames / 24 * 40) latents), compared. Weights: diffusers' init with constant tensors
perturbed (perf/denoiser_models.perturb_constants), handed to dif by name (audio: weight-norm folded).

Reported per component: diffusers ms, dif ms (median of --iters, after one warm-up), cosine and rel-L2.
Usage (GPU machine, repo root):   python3 perf/h3_vae.py --iters 3
Check the script on a CPU:         python3 perf/h3_vae.py --device cpu --tiny
Writes perf/results/h3_vae.json (and into $OUT when set; --tiny only into $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from denoiser_models import perturb_constants  # noqa: E402

from dif.runtime import prepare  # noqa: E402
from dif.weights import ArraySource  # noqa: E402
from dif.weights.weight_norm import WeightNormSource  # noqa: E402
from dif_frontend_h3.audio_vae import build_audio_decoder, decode_audio  # noqa: E402
from dif_frontend_h3.configs import published  # noqa: E402
from dif_frontend_h3.vae_config import PIXEL_MEAN, PIXEL_STD, AudioVaeConfig, VideoVaeConfig  # noqa: E402
from dif_frontend_h3.video_vae import build_video_decoder, video_decoder_inputs  # noqa: E402
from dif_frontend_h3.video_vae_encoder import build_video_encoder  # noqa: E402
from dif_frontend_h3.video_vae_tiling import VideoTiling, decode_video, encode_moments, normalize_pixels  # noqa: E402

TINY_VIDEO = dict(
    block_out_channels=[8, 16, 16], layers_per_block=1, spatial_downsample_factors=[2, 2, 1],
    temporal_downsample_factors=[2, 2, 1], norm_num_groups=4, decoder_num_layers=2, decoder_num_attention_heads=2,
    decoder_attention_head_dim=16, decoder_num_register_tokens=2, latent_channels=4,
    latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.5, 2.0, 1.0],
)  # fmt: skip
TINY_AUDIO = dict(
    encoder_dim=4, encoder_rates=[5, 2, 2], latent_dim=16, latent_channels=4, num_attention_heads=2, decoder_dim=16,
    decoder_rates=[5, 2, 2], decoder_kernel_sizes=[9, 4, 4], resblock_kernel_sizes=[3, 5],
    resblock_dilation_sizes=[[1, 3], [1, 2]], latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
)  # fmt: skip
KEEP_FP32 = ("encoder", "quant_conv", "norm1", "norm2", "norm_out", "scale1", "scale2")


def compare(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    x, y = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return {
        "cosine": float(x @ y / max(np.linalg.norm(x) * np.linalg.norm(y), 1e-30)),
        "rel_l2": float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)),
    }


def timed(fn: Any, iters: int, sync: Any) -> tuple[Any, float]:
    out = fn()
    sync()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        out = fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return out, statistics.median(times)


def _weights(program: Any, source: Any) -> dict[str, np.ndarray]:
    return {p.name: np.asarray(source[p.name], np.float32).astype(p.type.dtype.np) for p in program.params}


def video(args: argparse.Namespace, torch: Any, dev: str, report: dict[str, Any]) -> None:
    import diffusers

    config = TINY_VIDEO if args.tiny else json.loads((published() / "vae" / "config.json").read_text())
    cfg = VideoVaeConfig.from_dict(config)
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLMiniMaxH3.from_config(config).eval()
    perturb_constants(vae, "cpu", 1)
    state = {k: v.detach().float().numpy() for k, v in vae.state_dict().items()}
    dtype = torch.float32 if args.tiny else torch.bfloat16
    for name, p in vae.named_parameters():
        if not any(k in name.split(".") for k in KEEP_FP32):
            p.data = p.data.to(dtype)
    vae.to(dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    ratio, tiling = cfg.spatial_ratio, VideoTiling(16, 16, 8, 8) if args.tiny else VideoTiling()
    if args.tiny:
        vae.enable_tiling(16, 16, 8, 8)
    tile = (7, 4, 4) if args.tiny else (7, 16, 16)
    g = torch.Generator().manual_seed(2)
    z = torch.randn(1, cfg.latent_channels, *tile, generator=g)
    ref, ref_ms = timed(
        lambda: vae.decoder(vae.post_quant_conv(z.to(dev, dtype))).float().cpu().numpy(), args.iters, sync
    )
    program = build_video_decoder(
        cfg, frames=tile[0], height=tile[1], width=tile[2], dtype="f32" if args.tiny else "bf16"
    )
    exe, plan = prepare(program, _weights(program, state), args.backend)
    inputs = video_decoder_inputs(cfg, z.numpy())
    got, ms = timed(lambda: next(iter(exe.run(inputs).values())), args.iters, lambda: None)
    report["video_tile"] = {"shape": list(tile), "diffusers_ms": ref_ms, "dif_ms": ms, **compare(got, ref)}
    # whole decode: chunks x tiles, blended, pixel convention reverted
    n = (args.frames - 5) // 17
    lat = torch.randn(1, cfg.latent_channels, 5 * n + 2, args.height // ratio, args.width // ratio, generator=g)
    mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)
    pm, ps = torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1), torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1)

    def reference() -> np.ndarray:
        out = vae.decode((lat * std + mean).to(dev, dtype), return_dict=False)[0].float().cpu()
        return (out * ps + pm).clamp(0, 1).numpy()

    ref, ref_ms = timed(reference, 1, sync)
    run = lambda inputs: next(iter(exe.run(inputs).values()))  # noqa: E731
    got, ms = timed(lambda: decode_video(cfg, lat.numpy(), run, tiling=tiling), 1, lambda: None)
    report["video_decode"] = {"frames": list(got.shape[2:]), "diffusers_ms": ref_ms, "dif_ms": ms, **compare(got, ref)}
    # keyframe encoder, fp32
    enc_h, enc_w = (16, 16) if args.tiny else (256, 256)
    enc = build_video_encoder(cfg, height=min(enc_h, args.height), width=min(enc_w, args.width))
    enc_exe, _ = prepare(enc, _weights(enc, state), args.backend)
    pixels = torch.randint(0, 256, (1, 3, 1, args.height, args.width), generator=g, dtype=torch.uint8)
    x = normalize_pixels(pixels.numpy())
    ref, ref_ms = timed(
        lambda: vae.encode(torch.from_numpy(x).to(dev)).latent_dist.parameters.float().cpu().numpy(), 1, sync
    )
    got, ms = timed(
        lambda: encode_moments(cfg, x, lambda t: next(iter(enc_exe.run({"pixels": t}).values())), tiling),
        1,
        lambda: None,
    )
    report["keyframe_encode"] = {"diffusers_ms": ref_ms, "dif_ms": ms, **compare(got, ref)}


def audio(args: argparse.Namespace, torch: Any, dev: str, report: dict[str, Any]) -> None:
    import diffusers

    config = TINY_AUDIO if args.tiny else json.loads((published() / "audio_vae" / "config.json").read_text())
    cfg = AudioVaeConfig.from_dict(config)
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLMiniMaxH3Audio.from_config(config).eval()
    perturb_constants(vae, "cpu", 3)
    state = {k: v.detach().float().numpy() for k, v in vae.state_dict().items()}
    vae.to(dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    a = round(args.frames / 24 * 40)
    lat = torch.randn(2, cfg.latent_channels, a, generator=torch.Generator().manual_seed(4))
    mean = torch.tensor(cfg.latents_mean).view(1, -1, 1)
    std = torch.tensor(cfg.latents_std).view(1, -1, 1)
    ref, ref_ms = timed(
        lambda: vae.decode((lat * std + mean).to(dev), return_dict=False)[0][:, 0].cpu().numpy(), args.iters, sync
    )
    program = build_audio_decoder(cfg, num_latents=a)
    exe, _ = prepare(program, _weights(program, WeightNormSource(ArraySource(state))), args.backend)
    got, ms = timed(
        lambda: decode_audio(cfg, lat.numpy(), lambda i: next(iter(exe.run(i).values()))), args.iters, lambda: None
    )
    report["audio_decode"] = {
        "latents": a,
        "samples": int(got.shape[1]),
        "diffusers_ms": ref_ms,
        "dif_ms": ms,
        **compare(got, ref),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="torch device of diffusers")
    ap.add_argument("--backend", default=None, help="dif backend (default: cuda, or cpu with --device cpu)")
    ap.add_argument("--tiny", action="store_true", help="tiny configs (a CPU check of the script)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--frames", type=int, default=22, help="17n + 5 frames of the whole decode")
    ap.add_argument("--height", type=int, default=768)
    ap.add_argument("--width", type=int, default=1344)
    ap.add_argument("--only", choices=("video", "audio"), default=None)
    args = ap.parse_args()
    args.backend = args.backend or args.device
    if args.tiny:
        args.height, args.width = min(args.height, 28), min(args.width, 36)
    import torch

    torch.set_grad_enabled(False)
    report: dict[str, Any] = {"schema": "dif.perf.h3_vae/1", "tiny": args.tiny, "backend": args.backend}
    if args.only in (None, "audio"):
        audio(args, torch, args.device, report)
    if args.only in (None, "video"):
        video(args, torch, args.device, report)
    text = json.dumps(report, indent=2)
    targets = [Path(os.environ["OUT"]) / "h3_vae.json"] if os.environ.get("OUT") else []
    if not args.tiny:
        targets.append(Path(__file__).resolve().parent / "results" / "h3_vae.json")
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    for key, row in report.items():
        if isinstance(row, dict):
            print(f"{key:16s} diffusers {row['diffusers_ms']:9.1f} ms  dif {row['dif_ms']:9.1f} ms  "
                  f"cos {row['cosine']:.6f}  rel-L2 {row['rel_l2']:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
