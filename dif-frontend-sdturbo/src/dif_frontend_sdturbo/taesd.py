"""TAESD (diffusers' AutoencoderTiny, madebyollin/taesd) decoder as one DiffIR program: the opt-in
fast VAE (`--fast-vae`).

Frontend stage "decode". It takes the sampled latents raw: no division by the KL VAE's 0.18215
(TAESD's own scaling_factor is 1). Then, as DecoderTiny does:
  x = tanh(x / 3) * 3                                     (soft clamp of the latents)
  conv 3x3 (C -> C0), relu
  per level i: num_blocks[i] x Block, [nearest 2x, conv 3x3 without bias] (the last level: conv with bias -> 3)
  Block(x) = relu(conv(relu(conv(relu(conv x)))) + x)
The output is the image in [0, 1] (diffusers then maps it to [-1, 1]; dif keeps [0, 1]).
Names: `decoder.layers.{k}.weight` for the plain convs, `decoder.layers.{k}.conv.{0,2,4}.weight` for
blocks, k the index in diffusers' nn.Sequential (the original taesd_decoder files count from 1:
`dif_frontend_sdturbo.weights` maps them).
"""

from __future__ import annotations

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers import conv2d
from dif.layers.pixels import output_picture
from dif_frontend_sdturbo.config import TaesdConfig

MODULE = "taesd"
UNUSED = (r"encoder\..*",)


def _block(b: ProgramBuilder, x: Var, name: str, c: int) -> Var:
    h = b.emit("relu", conv2d(b, x, f"{name}.conv.0", c, 3, padding=1))
    h = b.emit("relu", conv2d(b, h, f"{name}.conv.2", c, 3, padding=1))
    h = conv2d(b, h, f"{name}.conv.4", c, 3, padding=1)
    skip = x if x.shape[1] == c else conv2d(b, x, f"{name}.skip", c, 1, bias=False)
    return b.emit("relu", b.emit("add", h, skip))


def build_taesd_decoder(
    cfg: TaesdConfig,
    *,
    latent_h: int,
    latent_w: int,
    batch: int = 1,
    dtype: DType | str = "f32",
    pixels: bool = False,
) -> Program:
    """Input `latent` (B, latent_channels, h, w), the raw sampled latents -> output `image`
    (B, out_channels, f h, f w) in [0, 1], f = upsampling_scaling_factor ** (levels - 1); with `pixels`
    (batch 1) its 8-bit pixels and their finiteness probe instead (`dif.layers.pixels`)."""
    dt = DType(dtype)
    b = ProgramBuilder("sd_taesd_decoder")
    b.meta.update({"family": "sdturbo", "component": "taesd", "dtype": dt.value, "outputs": "image"})
    x = b.input("latent", (batch, cfg.latent_channels, latent_h, latent_w), dt)
    m = float(cfg.latent_magnitude)
    with b.scope(module=MODULE, block="decoder.clamp", section="tanh"):
        x = b.emit("scalar_affine", b.emit("tanh", b.emit("scalar_affine", x, scale=1.0 / m)), scale=m)
    chans, k = cfg.block_out_channels, 0
    with b.scope(module=MODULE, block="decoder.layers.0", section="conv"):
        x = b.emit("relu", conv2d(b, x, "decoder.layers.0", chans[0], 3, padding=1))
    k = 2
    last = len(chans) - 1
    for i, (c, n) in enumerate(zip(chans, cfg.num_blocks, strict=True)):
        with b.scope(module=MODULE, block=f"decoder.level.{i}", section="blocks"):
            for _ in range(n):
                x = _block(b, x, f"decoder.layers.{k}", c)
                k += 1
            if i < last:
                x = b.emit("upsample_nearest", x, scale=cfg.upsampling_scaling_factor)
                k += 1
            out = cfg.out_channels if i == last else c
            x = conv2d(b, x, f"decoder.layers.{k}", out, 3, padding=1, bias=i == last)
            k += 1
    output_picture(b, x, pixels=pixels, value_range="0,1")
    return b.build()
