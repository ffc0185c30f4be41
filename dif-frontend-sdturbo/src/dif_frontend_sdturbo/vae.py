"""AutoencoderKL's decoder (SD 1.x / 2.x, SD-Turbo) as one DiffIR program: latents -> image.

Frontend stage "decode". The pipeline divides the sampled latents by `scaling_factor` (0.18215)
first (as StableDiffusionPipeline does; `vae_latents`), then:
  post_quant_conv (1x1) -> decoder.conv_in -> mid_block (resnet, 1-head spatial attention, resnet)
  -> up_blocks[i] ((layers_per_block + 1) resnets [+ nearest 2x, conv]) -> GN-silu-conv_out
All GroupNorms use eps 1e-6. Output in [-1, 1]-ish, unclamped (the pipeline maps to [0, 1] and clamps).
Parameter names are the diffusers state-dict names (`decoder.up_blocks.0.resnets.1.conv2.weight`).
"""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.layers import attention_block_2d, conv2d, norm_act_conv, resnet_block_2d, upsample_2d
from dif.layers.pixels import output_picture
from dif_frontend_sdturbo.config import VaeConfig

MODULE = "vae"
EPS = 1e-6
UNUSED = (r"encoder\..*", r"quant_conv\..*")
"""Tensors of an AutoencoderKL file the decoder does not read (regexes, matched in full)."""


def vae_latents(cfg: VaeConfig, latents: np.ndarray) -> np.ndarray:
    """Sampled latents as the decoder takes them: latents / scaling_factor (+ shift_factor), in their
    dtype, as the pipeline's one torch division rounds them."""
    x = (latents.astype(np.float32) / np.float32(cfg.scaling_factor)).astype(latents.dtype)
    if cfg.shift_factor:
        x = (x.astype(np.float32) + np.float32(cfg.shift_factor)).astype(latents.dtype)
    return x


def build_vae_decoder(
    cfg: VaeConfig, *, latent_h: int, latent_w: int, batch: int = 1, dtype: DType | str = "f32", pixels: bool = False
) -> Program:
    """Input `latent` (B, latent_channels, h, w), already scaled -> output `image` (B, out_channels, 8h, 8w)
    in [-1, 1]; with `pixels` (batch 1) its 8-bit pixels (8h, 8w, out_channels) and their finiteness probe
    instead (`dif.layers.pixels`)."""
    dt = DType(dtype)
    b = ProgramBuilder("sd_vae_decoder")
    b.meta.update({"family": "sdturbo", "component": "vae", "dtype": dt.value, "outputs": "image"})
    z = b.input("latent", (batch, cfg.latent_channels, latent_h, latent_w), dt)
    chans, g = cfg.block_out_channels, cfg.norm_num_groups
    if cfg.use_post_quant_conv:
        with b.scope(module=MODULE, block="post_quant_conv", section="conv"):
            z = conv2d(b, z, "post_quant_conv", cfg.latent_channels, 1)
    with b.scope(module=MODULE, block="decoder.conv_in", section="conv"):
        x = conv2d(b, z, "decoder.conv_in", chans[-1], 3, padding=1)
    name = "decoder.mid_block"
    with b.scope(module=MODULE, block=name, section="resnets.0"):
        x = resnet_block_2d(b, x, f"{name}.resnets.0", chans[-1], groups=g, eps=EPS)
    if cfg.mid_block_add_attention:
        with b.scope(module=MODULE, block=name, section="attentions.0"):
            x = attention_block_2d(b, x, f"{name}.attentions.0", groups=g, eps=EPS)
    with b.scope(module=MODULE, block=name, section="resnets.1"):
        x = resnet_block_2d(b, x, f"{name}.resnets.1", chans[-1], groups=g, eps=EPS)
    rev = list(reversed(chans))
    for i, out in enumerate(rev):
        name = f"decoder.up_blocks.{i}"
        with b.scope(module=MODULE, block=name, section="resnets"):
            for j in range(cfg.layers_per_block + 1):
                x = resnet_block_2d(b, x, f"{name}.resnets.{j}", out, groups=g, eps=EPS)
        if i < len(rev) - 1:
            with b.scope(module=MODULE, block=name, section="upsample"):
                x = upsample_2d(b, x, f"{name}.upsamplers.0")
    with b.scope(module=MODULE, block="decoder.conv_out", section="out"):
        image = norm_act_conv(b, x, "decoder.conv_norm_out", "decoder.conv_out", cfg.out_channels, groups=g, eps=EPS)
    output_picture(b, image, pixels=pixels, value_range="-1,1")
    return b.build()
