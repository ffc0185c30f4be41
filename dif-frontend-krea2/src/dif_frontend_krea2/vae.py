"""Qwen-Image VAE decoder (AutoencoderKLQwenImage) for one image, as a DiffIR program.

Frontend stage 4: denormalized latents (B, z, h, w) -> pixels (B, 3, 8h, 8w) in [-1, 1].
The reference decodes video with causal 3D convolutions whose time padding sits in front only;
for the first (and only) frame, with an empty feature cache, a k x k x k causal conv sees two
zero frames and then the frame, so it equals a 2D conv with the kernel's last temporal tap, and
the temporal upsampling convs are skipped. Parameters keep the diffusers names; the 3D kernels
are declared with their 2D shape and `weights.py` hands over the last temporal tap.
The channel RMS norm is `l2_normalize(x, channels) * sqrt(C) * gamma`.
"""

from __future__ import annotations

import math

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers.basic import activation, conv2d
from dif.layers.pixels import output_picture
from dif_frontend_krea2 import __version__
from dif_frontend_krea2.config import QwenImageVaeConfig

REVISION = f"dif-frontend-krea2 {__version__}"
MODULE = "vae"


def decoder_channels(cfg: QwenImageVaeConfig) -> list[int]:
    """Channel widths in decoder order: [bottom, then the output width of each up block]."""
    return [cfg.base_dim * m for m in (cfg.dim_mult[-1], *cfg.dim_mult[::-1])]


def _rms(b: ProgramBuilder, x: Var, name: str, *, image_gamma: bool = False) -> Var:
    """Channel RMS norm of x [N, C, H, W]: x / max(||x||_C, 1e-12) * sqrt(C) * gamma.

    `{name}.gamma` has the reference shape: (C, 1, 1) for the attention norm (`image_gamma`),
    (C, 1, 1, 1) elsewhere (built for video); it is viewed as (C, 1, 1) here."""
    c = x.shape[1]
    shape = (c, 1, 1) if image_gamma else (c, 1, 1, 1)
    gamma = b.param(f"{name}.gamma", shape, x.dtype)
    with b.scope(tensors=(gamma.name,)):
        n = b.emit("l2_normalize", x, axis=1, eps=1e-12)
        n = b.emit("scalar_affine", n, scale=math.sqrt(c))
        g = gamma if image_gamma else b.emit("reshape", gamma, shape=(c, 1, 1))
        return b.emit("mul", n, g)


def _conv(b: ProgramBuilder, x: Var, name: str, out_channels: int, kernel: int) -> Var:
    """A causal 3D conv on a single frame: 2D conv, 'same' spatial zero padding, bias."""
    return conv2d(b, x, name, out_channels, kernel, padding=kernel // 2)


def _resnet(b: ProgramBuilder, x: Var, name: str, out_channels: int) -> Var:
    """QwenImageResidualBlock: shortcut (1x1 when widths differ) + conv(silu(rms(conv(silu(rms x)))))."""
    with b.scope(block=name, section="resnet"):
        skip = x if x.shape[1] == out_channels else _conv(b, x, f"{name}.conv_shortcut", out_channels, 1)
        h = _conv(b, activation(b, _rms(b, x, f"{name}.norm1"), "silu"), f"{name}.conv1", out_channels, 3)
        h = _conv(b, activation(b, _rms(b, h, f"{name}.norm2"), "silu"), f"{name}.conv2", out_channels, 3)
        return b.emit("add", h, skip)


def _attention(b: ProgramBuilder, x: Var, name: str) -> Var:
    """QwenImageAttentionBlock: one head of width C over the H*W positions, 1x1 convs in and out."""
    n, c, hh, ww = x.shape
    with b.scope(block=name, section="attn"):
        h = conv2d(b, _rms(b, x, f"{name}.norm", image_gamma=True), f"{name}.to_qkv", 3 * c, 1)
        h = b.emit("transpose", b.emit("reshape", h, shape=(n, 3 * c, hh * ww)), perm=(0, 2, 1))
        q, k, v = (b.emit("reshape", t, shape=(n, hh * ww, 1, c)) for t in b.emit_multi("split", h, axis=2,
                                                                                         sizes=(c, c, c)))
        o = b.emit("reshape", b.emit("sdpa", q, k, v), shape=(n, hh * ww, c))
        o = b.emit("reshape", b.emit("transpose", o, perm=(0, 2, 1)), shape=(n, c, hh, ww))
        o = conv2d(b, o, f"{name}.proj", c, 1)
        return b.emit("add", o, x)


def _upsample(b: ProgramBuilder, x: Var, name: str) -> Var:
    """QwenImageResample up (2d or 3d; the time conv does not act on a first frame): nearest 2x, then
    `{name}.resample.1` (3x3, C -> C/2)."""
    with b.scope(block=name, section="upsample"):
        up = b.emit("upsample_nearest", x, scale=2)
        return conv2d(b, up, f"{name}.resample.1", x.shape[1] // 2, 3, padding=1)


def decode(b: ProgramBuilder, cfg: QwenImageVaeConfig, z: Var) -> Var:
    """z (B, z_dim, h, w) -> image (B, input_channels, h*2^k, w*2^k), clamped to [-1, 1]."""
    dims = decoder_channels(cfg)
    with b.scope(module=MODULE):
        with b.scope(block="post_quant_conv", section="in"):
            x = _conv(b, z, "post_quant_conv", cfg.z_dim, 1)
        with b.scope(block="decoder.conv_in", section="in"):
            x = _conv(b, x, "decoder.conv_in", dims[0], 3)
        x = _resnet(b, x, "decoder.mid_block.resnets.0", dims[0])
        x = _attention(b, x, "decoder.mid_block.attentions.0")
        x = _resnet(b, x, "decoder.mid_block.resnets.1", dims[0])
        n_up = len(dims) - 1
        for i in range(n_up):
            out_dim = dims[i + 1]
            for j in range(cfg.num_res_blocks + 1):
                x = _resnet(b, x, f"decoder.up_blocks.{i}.resnets.{j}", out_dim)
            if i != n_up - 1:
                x = _upsample(b, x, f"decoder.up_blocks.{i}.upsamplers.0")
        with b.scope(block="decoder.conv_out", section="out"):
            x = activation(b, _rms(b, x, "decoder.norm_out"), "silu")
            x = _conv(b, x, "decoder.conv_out", cfg.input_channels, 3)
            x = b.emit("clamp", x, lo=-1.0, hi=1.0)
    return x


def build_vae_decoder(
    cfg: QwenImageVaeConfig,
    *,
    latent_h: int,
    latent_w: int,
    batch: int = 1,
    dtype: DType | str = "f32",
    pixels: bool = False,
) -> Program:
    """Decode one frame. Input `latents` (B, z_dim, latent_h, latent_w), already denormalized
    (`latents * std + mean`, see `pipeline.denormalize`). Output (meta["outputs"] = "image"):
    (B, input_channels, latent_h * scale_factor, latent_w * scale_factor) in [-1, 1]; with `pixels` (batch 1)
    its 8-bit pixels and their finiteness probe instead (`dif.layers.pixels`)."""
    dt = DType(dtype)
    b = ProgramBuilder("krea2_vae_decoder", frontend_revision=REVISION)
    b.meta.update({"family": "krea2", "component": "vae", "dtype": dt.value})
    z = b.input("latents", (batch, cfg.z_dim, latent_h, latent_w), dt)
    b.meta["outputs"] = "image"
    output_picture(b, decode(b, cfg, z), pixels=pixels, value_range="-1,1")
    return b.build()


def unused_tensor_patterns() -> tuple[str, ...]:
    """Checkpoint tensors a single-image decode never reads: the encoder half and the temporal
    upsampling convs (regexes for `bind_weights(ignore=...)`)."""
    return (r"encoder\..*", r"quant_conv\..*", r"decoder\.up_blocks\.\d+\.upsamplers\.0\.time_conv\..*")
