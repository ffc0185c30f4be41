"""MiniMax-H3 video VAE decoder (AutoencoderKLMiniMaxH3: post_quant_conv + ViT decoder) for one latent
tile, as a DiffIR program, and the host tables it takes as inputs.

Frontend stage 4: the sampler's denormalized video latent is cut into temporal chunks and spatial tiles
(`video_vae_tiling`); each tile (B, C, T, h, w) goes through `build_video_decoder`'s program and comes
out as ImageNet-normalized RGB (B, 3, 4T, 16h, 16w); the tiling blends tiles and chunks and the pixel
convention is reverted there. Parameter names and shapes are diffusers' (`post_quant_conv.weight` is
the 5D 1x1x1 kernel, used as a linear over channels).

Precision follows the reference's `_keep_in_fp32_modules`: linears, register tokens and attention run
in `dtype`; norm1 / norm2 / norm_out and the layer scales are float32, and the residual stream becomes
float32 at the first layer-scaled residual (bf16 branch x fp32 scale promotes).
"""

from __future__ import annotations

import math

import numpy as np

from dif.dtypes import DType
from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers.basic import layer_norm, linear, rms_norm, split_heads
from dif_frontend_h3.vae_config import VideoVaeConfig

MODULE = "video_vae"
F32 = DType.F32


def cast(b: ProgramBuilder, x: Var, dtype: DType) -> Var:
    """x as `dtype` (no node when it already is)."""
    return x if x.dtype == dtype else b.emit("cast", x, dtype=dtype.value)


def decoder_sequence_length(cfg: VideoVaeConfig, frames: int, height: int, width: int) -> int:
    """Tokens of one tile: one per latent voxel, then the register tokens and one zero token."""
    return frames * height * width + cfg.decoder_num_register_tokens + 1


def video_decoder_rope(cfg: VideoVaeConfig, frames: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each (S, rope_dim) float32, of one tile's decoder tokens (S from
    `decoder_sequence_length`).

    Positions per axis are `2 * (i + 0.5) / size - 1` (the tile's own grid, in [-1, 1)), the suffix tokens
    sit at 0; angle = 2 pi * pos * theta^(-k / (rope_dim / 6)) for the rope_dim / 6 frequencies of each of
    the (t, h, w) axes, concatenated and duplicated ([a | a], rotate-halves layout). float32 throughout,
    in the reference's operation order (autoencoder_kl_minimax_h3.py, MiniMaxH3VideoRotaryPosEmbed)."""
    step = np.float32(6.0 / cfg.rope_dim)
    exponents = np.arange(0, 1, step, dtype=np.float32)
    inv_freq = (np.float32(1.0) / np.power(np.float32(cfg.decoder_rope_theta), exponents)).astype(np.float32)
    grids = [
        np.float32(2.0) * (np.arange(0.5, n, dtype=np.float32) / np.float32(n)) - np.float32(1.0)
        for n in (frames, height, width)
    ]
    mesh = np.stack(np.meshgrid(*grids, indexing="ij"), axis=-1).reshape(-1, 3)
    pos = np.concatenate([mesh, np.zeros((cfg.decoder_num_register_tokens + 1, 3), np.float32)], axis=0)
    angles = (np.float32(2.0 * math.pi) * pos)[:, :, None] * inv_freq[None, None, :]
    angles = angles.reshape(pos.shape[0], -1)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def video_decoder_inputs(cfg: VideoVaeConfig, latent: np.ndarray) -> dict[str, np.ndarray]:
    """The complete input dict of the decoder program for one latent tile (B, C, T, h, w) float32."""
    _, _, t, h, w = latent.shape
    cos, sin = video_decoder_rope(cfg, t, h, w)
    return {"latent": np.ascontiguousarray(latent, dtype=np.float32), "rope_cos": cos, "rope_sin": sin}


def build_video_decoder(
    cfg: VideoVaeConfig,
    *,
    frames: int,
    height: int,
    width: int,
    batch: int = 1,
    dtype: DType | str = "f32",
) -> Program:
    """AutoencoderKLMiniMaxH3's `decoder(post_quant_conv(z))` for one denormalized latent tile.

    Inputs: `latent` (batch, latent_channels, frames, height, width) float32; `rope_cos`, `rope_sin`
    (S, rope_dim) float32 from `video_decoder_rope` (S = frames*height*width + registers + 1).
    Output (meta["outputs"] = "pixels"): (batch, out_channels, frames*pt, height*p, width*p) float32,
    ImageNet-normalized RGB, unclamped (p = spatial ratio, pt = temporal ratio)."""
    if min(frames, height, width, batch) < 1:
        raise DifError(f"video VAE decoder: tile {frames}x{height}x{width} (batch {batch}) must be positive")
    dt = DType(dtype)
    b = ProgramBuilder("h3_video_vae_decoder")
    b.meta.update({"family": "h3", "component": "vae", "dtype": dt.value, "outputs": "pixels"})
    c, dim = cfg.latent_channels, cfg.decoder_dim
    n_tokens = frames * height * width
    seq = decoder_sequence_length(cfg, frames, height, width)
    z = b.input("latent", (batch, c, frames, height, width), F32)
    cos = b.input("rope_cos", (seq, cfg.rope_dim), F32)
    sin = b.input("rope_sin", (seq, cfg.rope_dim), F32)

    with b.scope(module=MODULE, block="post_quant_conv", section="conv1x1"):
        x = cast(b, z, dt)
        x = b.emit("transpose", x, perm=(0, 2, 3, 4, 1))  # tokens ordered (t, h, w)
        x = b.emit("reshape", x, shape=(batch, n_tokens, c))
        kernel = b.param("post_quant_conv.weight", (c, c, 1, 1, 1), dt)
        bias = b.param("post_quant_conv.bias", (c,), dt)
        with b.scope(tensors=("post_quant_conv.weight", "post_quant_conv.bias")):
            x = b.emit("linear", x, b.emit("reshape", kernel, shape=(c, c)), bias)
    with b.scope(module=MODULE, block="decoder.proj_in", section="tokens"):
        x = linear(b, x, "decoder.proj_in", dim, bias=True)
        regs = b.param("decoder.register_tokens", (1, cfg.decoder_num_register_tokens, dim), dt)
        with b.scope(tensors=(regs.name,)):
            if batch > 1:
                regs = b.emit("broadcast_to", regs, shape=(batch, cfg.decoder_num_register_tokens, dim))
            zero = b.emit("full", shape=(batch, 1, dim), value=0.0, dtype=dt.value)
            x = b.emit("concat", x, regs, zero, axis=1)
        cos_t, sin_t = cast(b, cos, dt), cast(b, sin, dt)
    for i in range(cfg.decoder_num_layers):
        x = _block(b, cfg, f"decoder.transformer_blocks.{i}", x, cos_t, sin_t, dt)
    with b.scope(module=MODULE, block="decoder.norm_out", section="out"):
        x = layer_norm(b, cast(b, x, F32), "decoder.norm_out", eps=cfg.decoder_norm_eps)
        x = linear(b, cast(b, x, dt), "decoder.proj_out", cfg.patch_features, bias=True)
        x = b.emit("slice", x, axis=1, start=0, stop=n_tokens)
    with b.scope(module=MODULE, block="decoder", section="unpatchify"):
        pt, p = cfg.temporal_ratio, cfg.spatial_ratio
        x = b.emit("reshape", x, shape=(batch, frames, height, width, cfg.out_channels, pt, p, p))
        x = b.emit("transpose", x, perm=(0, 4, 1, 5, 2, 6, 3, 7))
        x = b.emit("reshape", x, shape=(batch, cfg.out_channels, frames * pt, height * p, width * p))
        b.output(cast(b, x, F32))
    return b.build()


def _block(b: ProgramBuilder, cfg: VideoVaeConfig, name: str, x: Var, cos: Var, sin: Var, dt: DType) -> Var:
    """h += scale1 * Attn(norm1(h)); h += scale2 * FF(norm2(h)); norms and scales float32."""
    dim, eps = cfg.decoder_dim, cfg.decoder_norm_eps
    with b.scope(module=MODULE, block=name, section="attn"):
        h = _norm32(b, x, f"{name}.norm1", eps)
        a = _attention(b, cfg, f"{name}.attn", cast(b, h, dt), cos, sin)
        x = _scaled_residual(b, x, a, f"{name}.scale1", dim)
    with b.scope(module=MODULE, block=name, section="ff"):
        h = cast(b, _norm32(b, x, f"{name}.norm2", eps), dt)
        inner = cfg.decoder_ffn_mult * dim
        h = linear(b, h, f"{name}.ff.net.0.proj", 2 * inner, bias=True)
        h = b.emit("glu", h, act="silu", gated_half="second")  # diffusers SwiGLU: a * silu(b)
        h = linear(b, h, f"{name}.ff.net.2", dim, bias=True)
        return _scaled_residual(b, x, h, f"{name}.scale2", dim)


def _norm32(b: ProgramBuilder, x: Var, name: str, eps: float) -> Var:
    """torch.nn.RMSNorm with a float32 weight on float32(x)."""
    w = b.param(f"{name}.weight", (x.shape[-1],), F32)
    with b.scope(tensors=(w.name,)):
        return b.emit("rms_norm", cast(b, x, F32), w, eps=eps)


def _scaled_residual(b: ProgramBuilder, x: Var, branch: Var, name: str, dim: int) -> Var:
    scale = b.param(name, (dim,), F32)
    with b.scope(tensors=(name,)):
        return b.emit("add", cast(b, x, F32), b.emit("mul", cast(b, branch, F32), scale))


def _attention(b: ProgramBuilder, cfg: VideoVaeConfig, name: str, h: Var, cos: Var, sin: Var) -> Var:
    """q, k, v (bias) -> heads -> RMSNorm q, k (no affine, float32) -> partial rotate-halves RoPE -> sdpa
    -> to_out.0."""
    dim, hd, dt = cfg.decoder_dim, cfg.decoder_attention_head_dim, h.dtype
    q, k, v = (split_heads(b, linear(b, h, f"{name}.{p}", dim, bias=True), hd) for p in ("to_q", "to_k", "to_v"))
    q, k = (cast(b, rms_norm(b, cast(b, t, F32), None, eps=cfg.decoder_norm_eps), dt) for t in (q, k))
    q, k = (b.emit("rope", t, cos, sin, mode="half") for t in (q, k))
    o = b.emit("sdpa", q, k, v)
    o = b.emit("reshape", o, shape=(*o.shape[:2], dim))
    return linear(b, o, f"{name}.to_out.0", dim, bias=True)
