"""FLUX.2 VAE (AutoencoderKLFlux2) as DiffIR programs: latent decode prep, decoder, encoder.

Frontend stage, after sampling: packed DiT latents (B, N, 128) -> BatchNorm de-normalisation and
unpatchify (`build_latent_decode_prep`, or folded into the decoder with `from_packed=True`) ->
32-channel latent -> `build_vae_decoder` -> image in [-1, 1]-ish (the pipeline does
(x/2 + 0.5).clamp(0, 1)). The encoder goes the other way for reference images.
Parameter names are the diffusers state-dict names (`decoder.up_blocks.0.resnets.1.conv2.weight`,
`post_quant_conv.weight`, `bn.running_mean` ...).
"""

from __future__ import annotations

from dif.dtypes import DType
from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers import (
    attention_block_2d,
    conv2d,
    downsample_2d,
    norm_act_conv,
    resnet_block_2d,
    upsample_2d,
)
from dif.layers.pixels import output_picture
from dif_frontend_flux2.config import Flux2VaeConfig

MODULE = "vae"
RESNET_EPS = 1e-6


def _bn_stats(b: ProgramBuilder, cfg: Flux2VaeConfig, dt: DType) -> tuple[Var, Var]:
    """(running_mean, sqrt(running_var + eps)), each (C*4,) — BatchNorm over the patchified latent."""
    c = cfg.patched_channels
    mean = b.param("bn.running_mean", (c,), dt)
    var = b.param("bn.running_var", (c,), dt)
    with b.scope(tensors=("bn.running_mean", "bn.running_var")):
        std = b.emit("sqrt", b.emit("scalar_affine", var, bias=cfg.batch_norm_eps))
    return mean, std


def _emit_unpack(b: ProgramBuilder, cfg: Flux2VaeConfig, packed: Var, latent_h: int, latent_w: int) -> Var:
    """(B, (h/2)(w/2), 4C) normalized tokens -> de-normalize -> unpatchify -> (B, C, h, w).

    Token order is row-major over the (h/2, w/2) grid; channel index is c*4 + 2*dy + dx."""
    bsz, c = packed.shape[0], cfg.latent_channels
    gh, gw = latent_h // 2, latent_w // 2
    with b.scope(module=MODULE, block="bn", section="denormalize"):
        mean, std = _bn_stats(b, cfg, packed.dtype)
        x = b.emit("add", b.emit("mul", packed, std), mean)
    with b.scope(module=MODULE, block="bn", section="unpatchify"):
        x = b.emit("reshape", x, shape=(bsz, gh, gw, c, 2, 2))
        x = b.emit("transpose", x, perm=(0, 3, 1, 4, 2, 5))
        return b.emit("reshape", x, shape=(bsz, c, latent_h, latent_w))


def _emit_pack(b: ProgramBuilder, cfg: Flux2VaeConfig, latent: Var) -> Var:
    """(B, C, h, w) -> patchify -> pack (B, (h/2)(w/2), 4C) -> BatchNorm-normalize."""
    bsz, c, h, w = latent.shape
    with b.scope(module=MODULE, block="bn", section="patchify"):
        x = b.emit("reshape", latent, shape=(bsz, c, h // 2, 2, w // 2, 2))
        x = b.emit("transpose", x, perm=(0, 2, 4, 1, 3, 5))
        x = b.emit("reshape", x, shape=(bsz, (h // 2) * (w // 2), 4 * c))
    with b.scope(module=MODULE, block="bn", section="normalize"):
        mean, std = _bn_stats(b, cfg, latent.dtype)
        return b.emit("div", b.emit("sub", x, mean), std)


def _check_latent(latent_h: int, latent_w: int) -> None:
    if latent_h <= 0 or latent_w <= 0 or latent_h % 2 or latent_w % 2:
        raise DifError(f"VAE latent size {latent_h}x{latent_w} must be positive and even (2x2 patches)")


def build_latent_decode_prep(
    cfg: Flux2VaeConfig, *, batch: int, latent_h: int, latent_w: int, dtype: DType | str = "f32"
) -> Program:
    """Packed DiT latents -> VAE latent.

    Input `latents` (B, (latent_h/2)(latent_w/2), 4*latent_channels); params bn.running_mean/var.
    Output (meta["outputs"] = "latent"): (B, latent_channels, latent_h, latent_w).
    latent_h/latent_w are the VAE latent size (image size / 8), i.e. twice the DiT token grid."""
    _check_latent(latent_h, latent_w)
    dt = DType(dtype)
    b = ProgramBuilder("flux2_latent_decode_prep")
    b.meta.update({"family": "flux2", "component": "vae", "dtype": dt.value, "outputs": "latent"})
    packed = b.input("latents", (batch, (latent_h // 2) * (latent_w // 2), cfg.patched_channels), dt)
    b.output(_emit_unpack(b, cfg, packed, latent_h, latent_w))
    return b.build()


def build_vae_decoder(
    cfg: Flux2VaeConfig,
    *,
    batch: int,
    latent_h: int,
    latent_w: int,
    dtype: DType | str = "f32",
    from_packed: bool = False,
    pixels: bool = False,
) -> Program:
    """AutoencoderKLFlux2.decode as one program.

    Input `latent` (B, latent_channels, latent_h, latent_w) — or, with from_packed=True, `latents`
    (B, (latent_h/2)(latent_w/2), 4*latent_channels) straight from the sampler, de-normalized and
    unpatchified in-program (adds bn.running_mean/var params).
    Output (meta["outputs"] = "image"): (B, out_channels, 8*latent_h, 8*latent_w), unclamped; with `pixels`
    (batch 1) its 8-bit pixels and their finiteness probe instead (`dif.layers.pixels`)."""
    _check_latent(latent_h, latent_w)
    dt = DType(dtype)
    b = ProgramBuilder("flux2_vae_decoder")
    b.meta.update({"family": "flux2", "component": "vae", "dtype": dt.value, "outputs": "image"})
    if from_packed:
        packed = b.input("latents", (batch, (latent_h // 2) * (latent_w // 2), cfg.patched_channels), dt)
        z = _emit_unpack(b, cfg, packed, latent_h, latent_w)
    else:
        z = b.input("latent", (batch, cfg.latent_channels, latent_h, latent_w), dt)
    output_picture(b, _decoder(b, cfg, z), pixels=pixels, value_range="-1,1")
    return b.build()


def _decoder(b: ProgramBuilder, cfg: Flux2VaeConfig, z: Var) -> Var:
    chans = cfg.decoder_channels
    groups = cfg.norm_num_groups
    if cfg.use_post_quant_conv:
        with b.scope(module=MODULE, block="post_quant_conv", section="conv"):
            z = conv2d(b, z, "post_quant_conv", cfg.latent_channels, 1)
    with b.scope(module=MODULE, block="decoder.conv_in", section="conv"):
        x = conv2d(b, z, "decoder.conv_in", chans[-1], 3, padding=1)
    x = _mid_block(b, cfg, "decoder.mid_block", x)
    rev = list(reversed(chans))
    for i, out_ch in enumerate(rev):
        name = f"decoder.up_blocks.{i}"
        with b.scope(module=MODULE, block=name, section="resnets"):
            for j in range(cfg.layers_per_block + 1):
                x = resnet_block_2d(b, x, f"{name}.resnets.{j}", out_ch, groups=groups, eps=RESNET_EPS)
        if i < len(rev) - 1:
            with b.scope(module=MODULE, block=name, section="upsample"):
                x = upsample_2d(b, x, f"{name}.upsamplers.0")
    with b.scope(module=MODULE, block="decoder.conv_out", section="out"):
        return norm_act_conv(
            b, x, "decoder.conv_norm_out", "decoder.conv_out", cfg.out_channels, groups=groups, eps=RESNET_EPS
        )


def _mid_block(b: ProgramBuilder, cfg: Flux2VaeConfig, name: str, x: Var) -> Var:
    """resnet -> (one-head spatial attention) -> resnet, all at the block's channel count."""
    groups, c = cfg.norm_num_groups, x.shape[1]
    with b.scope(module=MODULE, block=name, section="resnets.0"):
        x = resnet_block_2d(b, x, f"{name}.resnets.0", c, groups=groups, eps=RESNET_EPS)
    if cfg.mid_block_add_attention:
        with b.scope(module=MODULE, block=name, section="attentions.0"):
            x = attention_block_2d(b, x, f"{name}.attentions.0", groups=groups, eps=RESNET_EPS)
    with b.scope(module=MODULE, block=name, section="resnets.1"):
        return resnet_block_2d(b, x, f"{name}.resnets.1", c, groups=groups, eps=RESNET_EPS)


def build_vae_encoder(
    cfg: Flux2VaeConfig,
    *,
    batch: int,
    height: int,
    width: int,
    dtype: DType | str = "f32",
    to_packed: bool = False,
) -> Program:
    """AutoencoderKLFlux2.encode, taking the posterior mean (what Klein uses for reference images).

    Input `image` (B, in_channels, H, W) in [-1, 1], H and W multiples of 2 * scale_factor.
    Output (meta["outputs"]): `latent` (B, latent_channels, H/8, W/8), or with to_packed=True
    `latents` (B, (H/16)(W/16), 4*latent_channels): patchified, packed and BatchNorm-normalized
    like the pipeline's reference-image latents (adds bn.running_mean/var params)."""
    step = 2 * cfg.scale_factor
    if height <= 0 or width <= 0 or height % step or width % step:
        raise DifError(f"VAE encoder input {height}x{width} must be a positive multiple of {step}")
    dt = DType(dtype)
    groups = cfg.norm_num_groups
    chans = cfg.block_out_channels
    b = ProgramBuilder("flux2_vae_encoder")
    b.meta.update(
        {"family": "flux2", "component": "vae", "dtype": dt.value, "outputs": "latents" if to_packed else "latent"}
    )
    x = b.input("image", (batch, cfg.in_channels, height, width), dt)
    with b.scope(module=MODULE, block="encoder.conv_in", section="conv"):
        x = conv2d(b, x, "encoder.conv_in", chans[0], 3, padding=1)
    for i, out_ch in enumerate(chans):
        name = f"encoder.down_blocks.{i}"
        with b.scope(module=MODULE, block=name, section="resnets"):
            for j in range(cfg.layers_per_block):
                x = resnet_block_2d(b, x, f"{name}.resnets.{j}", out_ch, groups=groups, eps=RESNET_EPS)
        if i < len(chans) - 1:
            with b.scope(module=MODULE, block=name, section="downsample"):
                x = downsample_2d(b, x, f"{name}.downsamplers.0")
    x = _mid_block(b, cfg, "encoder.mid_block", x)
    with b.scope(module=MODULE, block="encoder.conv_out", section="out"):
        x = norm_act_conv(
            b, x, "encoder.conv_norm_out", "encoder.conv_out", 2 * cfg.latent_channels, groups=groups, eps=RESNET_EPS
        )
    if cfg.use_quant_conv:
        with b.scope(module=MODULE, block="quant_conv", section="conv"):
            x = conv2d(b, x, "quant_conv", 2 * cfg.latent_channels, 1)
    with b.scope(module=MODULE, block="posterior", section="mean"):
        mean = b.emit("slice", x, axis=1, start=0, stop=cfg.latent_channels)
    b.output(_emit_pack(b, cfg, mean) if to_packed else mean)
    return b.build()
