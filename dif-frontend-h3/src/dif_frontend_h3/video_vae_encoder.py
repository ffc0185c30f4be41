"""MiniMax-H3 video VAE encoder (AutoencoderKLMiniMaxH3: causal 3D CNN + quant_conv) for one pixel
tile, as a DiffIR program: what fl2va's keyframes (and one clip of a reference video) go through.

Conditioning stage (fl2va): ImageNet-normalized pixels (B, 3, F, H, W) -> posterior moments
(B, 2C, F', H/16, W/16); `video_vae_tiling.encode_moments` tiles and stitches, then the posterior is
sampled and normalized there. Activations are kept frames-in-batch, [B*F, C, H, W]: GroupNorm per frame
is then a plain GroupNorm (the reference folds time into the batch too), and each causal 3D conv
(spatial **reflect** pad, 2 zero frames in front) is a sum over its temporal taps of 2D convs of the
frames each tap sees; a tap that only sees the zero frames is skipped, so one frame costs exactly the
2D convs of the kernels' last taps. Parameters are diffusers' 5D kernels, sliced in the program.
float32 throughout (the reference pins the encoder to float32).
"""

from __future__ import annotations

from dif.dtypes import DType
from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers.basic import activation, group_norm
from dif_frontend_h3.vae_config import VideoVaeConfig

MODULE = "video_vae_encoder"
F32 = DType.F32


class Frames:
    """A [B*F, C, H, W] value with its batch and frame counts."""

    def __init__(self, x: Var, batch: int, frames: int) -> None:
        self.x, self.batch, self.frames = x, batch, frames


def _spatial_pad(b: ProgramBuilder, x: Var, pads: tuple[int, int, int, int], mode: str) -> Var:
    """(top, bottom, left, right) padding of [N, C, H, W], reflect or zeros."""
    if not any(pads):
        return x
    top, bottom, left, right = pads
    if mode == "reflect" and (max(top, bottom) >= x.shape[2] or max(left, right) >= x.shape[3]):
        raise DifError(f"video VAE encoder: reflect padding needs more than {x.shape[2]}x{x.shape[3]} pixels here")
    return b.emit("pad", x, pads=(0, 0, 0, 0, top, bottom, left, right), mode=mode)


def causal_conv3d(
    b: ProgramBuilder,
    f: Frames,
    name: str,
    out_channels: int,
    kernel: int,
    *,
    stride: tuple[int, int] = (1, 1),
    spatial_pad: tuple[int, int, int, int] = (0, 0, 0, 0),
    temporal_pad: int = 0,
    mode: str = "reflect",
) -> Frames:
    """MiniMaxH3VideoCausalConv3d: `{name}.weight` [O, C, k, k, k] (+ bias), `temporal_pad` zero frames in
    front, stride (temporal, spatial). Output frame t sums, over taps dt, the 2D conv of input frame
    t * st + dt - temporal_pad with the kernel's tap dt (absent frames are the zero padding)."""
    c = f.x.shape[1]
    w = b.param(f"{name}.weight", (out_channels, c, kernel, kernel, kernel), F32)
    bias = b.param(f"{name}.bias", (out_channels,), F32)
    st, ss = stride
    t_out = (f.frames + temporal_pad - kernel) // st + 1
    if t_out < 1:
        raise DifError(f"video VAE encoder: {f.frames} frames too few for {name}")
    with b.scope(tensors=(w.name, bias.name)):
        x = _spatial_pad(b, f.x, spatial_pad, mode)
        _, _, hp, wp = x.shape
        x5 = b.emit("reshape", x, shape=(f.batch, f.frames, c, hp, wp))
        total = None
        # the last tap first: it sees every output frame's own frame, and carries the bias
        for dt in reversed(range(kernel)):
            first = [t for t in range(t_out) if t * st + dt - temporal_pad >= 0]
            if not first:
                continue
            t0, n = first[0], len(first)
            start = t0 * st + dt - temporal_pad
            seen = b.emit("slice", x5, axis=1, start=start, stop=start + (n - 1) * st + 1, step=st)
            seen = b.emit("reshape", seen, shape=(f.batch * n, c, hp, wp))
            tap = b.emit("slice", w, axis=2, start=dt, stop=dt + 1)
            tap = b.emit("reshape", tap, shape=(out_channels, c, kernel, kernel))
            y = b.emit("conv2d", seen, tap, bias if total is None else None, stride=(ss, ss))
            _, _, ho, wo = y.shape
            y = b.emit("reshape", y, shape=(f.batch, n, out_channels, ho, wo))
            if t0:
                y = b.emit("pad", y, pads=(0, 0, t0, 0, 0, 0, 0, 0, 0, 0))
            total = y if total is None else b.emit("add", total, y)
        assert total is not None
        _, _, _, ho, wo = total.shape
        return Frames(b.emit("reshape", total, shape=(f.batch * t_out, out_channels, ho, wo)), f.batch, t_out)


def _norm_silu(b: ProgramBuilder, cfg: VideoVaeConfig, f: Frames, name: str) -> Frames:
    h = group_norm(b, f.x, name, groups=cfg.norm_num_groups, eps=cfg.norm_eps)
    return Frames(activation(b, h, "silu"), f.batch, f.frames)


def _conv3(b: ProgramBuilder, cfg: VideoVaeConfig, f: Frames, name: str, out: int) -> Frames:
    return causal_conv3d(b, f, name, out, 3, spatial_pad=(1, 1, 1, 1), temporal_pad=2, mode=cfg.spatial_padding_mode)


def _resnet(b: ProgramBuilder, cfg: VideoVaeConfig, f: Frames, name: str, out: int) -> Frames:
    h = _conv3(b, cfg, _norm_silu(b, cfg, f, f"{name}.norm1"), f"{name}.conv1", out)
    h = _conv3(b, cfg, _norm_silu(b, cfg, h, f"{name}.norm2"), f"{name}.conv2", out)
    skip = f if f.x.shape[1] == out else causal_conv3d(b, f, f"{name}.conv_shortcut", out, 1)
    return Frames(b.emit("add", skip.x, h.x), f.batch, f.frames)


def build_video_encoder(
    cfg: VideoVaeConfig, *, height: int, width: int, frames: int = 1, batch: int = 1, dtype: DType | str = "f32"
) -> Program:
    """`quant_conv(encoder(x))` of AutoencoderKLMiniMaxH3 for one pixel tile.

    Input `pixels` (batch, in_channels, frames, height, width) float32, ImageNet-normalized.
    Output (meta["outputs"] = "moments"): (batch, 2 * latent_channels, frames', height / 16, width / 16),
    the posterior's [mean | logvar] (frames' = 1 for one frame, 5 for a 17-frame clip)."""
    if DType(dtype) != F32:
        raise DifError("video VAE encoder: the reference pins the encoder to float32; build it with dtype='f32'")
    if min(height, width, frames, batch) < 1:
        raise DifError(f"video VAE encoder: tile {frames}x{height}x{width} (batch {batch}) must be positive")
    b = ProgramBuilder("h3_video_vae_encoder")
    b.meta.update({"family": "h3", "component": "vae", "dtype": "f32", "outputs": "moments"})
    x = b.input("pixels", (batch, cfg.in_channels, frames, height, width), F32)
    with b.scope(module=MODULE, block="encoder.conv_in", section="conv"):
        x = b.emit("transpose", x, perm=(0, 2, 1, 3, 4))
        f = Frames(b.emit("reshape", x, shape=(batch * frames, cfg.in_channels, height, width)), batch, frames)
        f = _conv3(b, cfg, f, "encoder.conv_in", cfg.block_out_channels[0])
    levels = zip(cfg.block_out_channels, cfg.spatial_downsample_factors, cfg.temporal_downsample_factors, strict=True)
    for i, (out, s, t) in enumerate(levels):
        name = f"encoder.down_blocks.{i}"
        with b.scope(module=MODULE, block=name, section="resnets"):
            for j in range(cfg.layers_per_block):
                f = _resnet(b, cfg, f, f"{name}.resnets.{j}", out)
        if s * t > 1:
            with b.scope(module=MODULE, block=name, section="downsample"):
                # the reference pads bottom / right by one (reflect) only for a spatial stride of 2
                pads = (0, 1, 0, 1) if s == 2 else (0, 0, 0, 0)
                g = Frames(_spatial_pad(b, f.x, pads, cfg.spatial_padding_mode), f.batch, f.frames)
                f = causal_conv3d(b, g, f"{name}.downsamplers.0.conv", out, 3, stride=(t, s), temporal_pad=2)
    with b.scope(module=MODULE, block="encoder.conv_out", section="out"):
        f = _conv3(b, cfg, _norm_silu(b, cfg, f, "encoder.norm_out"), "encoder.conv_out", 2 * cfg.latent_channels)
    with b.scope(module=MODULE, block="quant_conv", section="conv1x1"):
        m = 2 * cfg.latent_channels
        f = causal_conv3d(b, f, "quant_conv", m, 1)
        _, _, ho, wo = f.x.shape
        y = b.emit("reshape", f.x, shape=(batch, f.frames, m, ho, wo))
        b.output(b.emit("transpose", y, perm=(0, 2, 1, 3, 4)))
    return b.build()
