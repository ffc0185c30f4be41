"""The MiniMax-H3 VAE programs (video decoder tile, video encoder tile, audio decoder) through the real
runtime on every backend present: optimizer passes, planner, executor, against the reference
interpreter on the same random weights (tiny configs, no oracle needed). CPU always runs; OpenCL runs
on any platform (PoCL here and in CI); CUDA skips with the reason when no GPU is usable."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dif.interp import interpret
from dif.ir.program import Program
from dif.runtime import prepare
from dif.testing.backends import backend_skip_reason
from dif_frontend_h3.audio_vae import build_audio_decoder
from dif_frontend_h3.vae_config import AudioVaeConfig, VideoVaeConfig
from dif_frontend_h3.video_vae import build_video_decoder, video_decoder_inputs
from dif_frontend_h3.video_vae_encoder import build_video_encoder

VIDEO = VideoVaeConfig.from_dict(
    dict(
        block_out_channels=[8, 16, 16], layers_per_block=1, spatial_downsample_factors=[2, 2, 1],
        temporal_downsample_factors=[2, 2, 1], norm_num_groups=4, decoder_num_layers=2,
        decoder_num_attention_heads=2, decoder_attention_head_dim=16, decoder_num_register_tokens=2,
        latent_channels=4, latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
    )
)  # fmt: skip
AUDIO = AudioVaeConfig.from_dict(
    dict(
        encoder_rates=[5, 2, 2], latent_dim=16, latent_channels=4, decoder_dim=16, decoder_rates=[5, 2, 2],
        decoder_kernel_sizes=[9, 4, 4], resblock_kernel_sizes=[3, 5], resblock_dilation_sizes=[[1, 3], [1, 2]],
        latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
    )
)  # fmt: skip


def _weights(program: Program, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for p in program.params:
        shape = tuple(p.type.shape)
        fan = max(1, math.prod(shape[1:]))
        w = rng.standard_normal(shape) / math.sqrt(fan)
        if p.name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight", "filter")):
            w = 1.0 + 0.1 * w if not p.name.endswith("filter") else np.full(shape, 1.0 / shape[-1])
        out[p.name] = w.astype(p.type.dtype.np)
    return out


def _cases() -> list[tuple[str, Program, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    dec = build_video_decoder(VIDEO, frames=7, height=3, width=4)
    enc = build_video_encoder(VIDEO, frames=5, height=12, width=16)
    aud = build_audio_decoder(AUDIO, num_latents=5)
    return [
        ("video-decoder", dec, video_decoder_inputs(VIDEO, rng.standard_normal((1, 4, 7, 3, 4)).astype(np.float32))),
        ("video-encoder", enc, {"pixels": rng.standard_normal((1, 3, 5, 12, 16)).astype(np.float32)}),
        ("audio-decoder", aud, {"latents": 0.5 * rng.standard_normal((2, 4, 5)).astype(np.float32)}),
    ]


def _opencl_skip() -> str | None:
    try:
        from dif_backend_opencl.device import availability
    except ImportError as exc:
        return f"dif-backend-opencl is not installed ({exc})"
    avail = availability()
    return None if avail.ok else avail.reason


BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("opencl", id="opencl", marks=pytest.mark.opencl),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", range(3), ids=["video-decoder", "video-encoder", "audio-decoder"])
def test_program_runs_on_backend(backend: str, case: int) -> None:
    why = {"cuda": lambda: backend_skip_reason("cuda"), "opencl": _opencl_skip}.get(backend, lambda: None)()
    if why is not None:
        pytest.skip(f"{backend} backend unavailable: {why}")
    _, program, inputs = _cases()[case]
    weights = _weights(program, case)
    expected = interpret(program, inputs, weights)[program.outputs[0]]
    target: object = backend
    if backend == "opencl":  # host evaluation off: every node runs as an OpenCL kernel
        from dif_backend_opencl.device import OpenCLBackend

        target = OpenCLBackend(host_eval_max_bytes=0)
    executable, _ = prepare(program, weights, target)  # type: ignore[arg-type]
    got = next(iter(executable.run(inputs).values()))
    assert got.shape == expected.shape
    err = float(np.linalg.norm(got.astype(np.float64) - expected) / np.linalg.norm(expected))
    assert err <= 1e-5, f"{backend}: rel-L2 {err:.3e}"
