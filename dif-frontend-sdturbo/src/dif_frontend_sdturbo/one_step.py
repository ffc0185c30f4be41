"""A one-step run as one program: CLIP -> UNet -> the Euler step -> decoder -> 8-bit pixels.

Why: at one step the three stage programs' device time on the H200 (text encoder 1.4-2.1 ms, UNet 6.5 ms,
TAESD 2.1 ms) is close to what the host spends between them: the text features and the UNet's output
downloaded, the Euler step in numpy (slow in fp16), uploads, three synchronizations. Inlined into one
program (`ProgramBuilder.inline`), the intermediates stay on the device and a backend runs the whole path
as one graph. Each stage's finiteness probe (`dif.layers.probe`) comes back instead of the stage's tensor,
so a non-finite stage is still refused by name.

The math is the host loop's (`dif_frontend_sdturbo.sampling.scale_model_input` and `euler_step`,
`dif_frontend_sdturbo.vae.vae_latents`), rounded to the run dtype at the same points; its scalar divisions
become multiplications by the reciprocal (within one float32 rounding).
"""

from __future__ import annotations

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers.probe import finite_probe

# the program's outputs, in order (meta "outputs")
OUTPUTS = ("pixels", "image_probe", "latents", "text_probe", "eps_probe")
# parameter prefixes of the inlined programs (`dif.weights.bind.PrefixedWeights` binds them)
TEXT, UNET, DECODER = "text_encoder.", "unet.", "decoder."


def _affine_f32(b: ProgramBuilder, x: Var, scale: float, bias: float = 0.0) -> Var:
    """x * scale + bias computed in float32 and rounded back to x's dtype (a float32 scalar times a
    tensor, as torch does it on the host path)."""
    dt = x.dtype
    y = b.emit("scalar_affine", x if dt == DType.F32 else b.emit("cast", x, dtype="f32"), scale=scale, bias=bias)
    return y if dt == DType.F32 else b.emit("cast", y, dtype=dt.value)


def _euler_step(b: ProgramBuilder, sample: Var, eps: Var, sigma: float, sigma_next: float) -> Var:
    """`sampling.euler_step` in the program: x0 = sample - (sigma * eps rounded to eps's dtype), then
    sample + (sample - x0) / sigma * (sigma_next - sigma) in float32, rounded to eps's dtype."""
    x = sample if sample.dtype == DType.F32 else b.emit("cast", sample, dtype="f32")
    prod = _affine_f32(b, eps, sigma)
    if prod.dtype != DType.F32:
        prod = b.emit("cast", prod, dtype="f32")
    derivative = b.emit("scalar_affine", b.emit("sub", x, b.emit("sub", x, prod)), scale=1.0 / sigma, bias=0.0)
    out = b.emit("add", x, b.emit("scalar_affine", derivative, scale=sigma_next - sigma, bias=0.0))
    return out if eps.dtype == DType.F32 else b.emit("cast", out, dtype=eps.dtype.value)


def build_one_step(
    text_encoder: Program,
    unet: Program,
    decoder: Program,
    *,
    init_sigma: float,
    sigma: float,
    sigma_next: float,
    latent_scale: float = 1.0,
    latent_shift: float = 0.0,
) -> Program:
    """input_ids (1, L), noise (1, C, h, w) unit noise in the run dtype, timestep_proj (1, T) -> OUTPUTS.

    `text_encoder` ends in the features the UNet's "text" input takes; `decoder` is built with pixels
    (outputs: pixels, finite probe). The noise is scaled by `init_sigma`, scaled for the model input at
    `sigma`, stepped to `sigma_next`; the decoder reads latents * `latent_scale` + `latent_shift` (the KL
    VAE's 1 / scaling_factor; TAESD takes raw latents: 1, 0)."""
    b = ProgramBuilder("sd_one_step")
    b.meta.update({"family": "sd", "component": "one_step", "outputs": ",".join(OUTPUTS)})
    (ids_in,) = text_encoder.inputs
    noise_in = next(v for v in unet.inputs if v.name == "sample")
    proj_in = next(v for v in unet.inputs if v.name == "timestep_proj")
    ids = b.input(ids_in.name, ids_in.type.shape, ids_in.type.dtype)
    noise = b.input("noise", noise_in.type.shape, noise_in.type.dtype)
    proj = b.input(proj_in.name, proj_in.type.shape, proj_in.type.dtype)

    (text,) = b.inline(text_encoder, {ids_in.name: ids}, params=TEXT)
    with b.scope(module="sampler", block="euler", section="scale_input"):
        sample = _affine_f32(b, noise, init_sigma)
        model_in = _affine_f32(b, sample, 1.0 / (sigma**2 + 1.0) ** 0.5)
    (eps,) = b.inline(unet, {"sample": model_in, "timestep_proj": proj, "text": text}, params=UNET)
    with b.scope(module="sampler", block="euler", section="step"):
        latents = _euler_step(b, sample, eps, sigma, sigma_next)
        latent = latents
        if latent_scale != 1.0:
            latent = _affine_f32(b, latent, latent_scale)
        if latent_shift:
            latent = _affine_f32(b, latent, 1.0, latent_shift)
    pixels, image_probe = b.inline(decoder, {"latent": latent}, params=DECODER)
    with b.scope(module="sampler", block="probes"):
        b.output(pixels, image_probe, latents, finite_probe(b, text), finite_probe(b, eps))
    return b.build()
