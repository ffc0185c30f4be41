"""MiniMax-H3 audio VAE decoder (AutoencoderKLMiniMaxH3Audio: dec_in_proj + BigVGAN) as a DiffIR
program, and the host step around it (latent denormalization, stereo as two batch items).

Frontend stage 4: the sampler's audio latents (2, 32, A) -> `decode_audio` -> waveform (2, A * 800) at
32 kHz in [-1, 1]. The decoder: 1x1 `dec_in_proj` -> conv_pre k7 -> per stage a transposed-conv
upsampler then the mean of the AMP blocks (each dilation: x += conv2(Act(conv1(Act(x))))) -> Act ->
conv_post k7 -> clamp. `Act` is the alias-free SnakeBeta: 2x Kaiser-sinc upsample (replicate pad,
depthwise transposed conv, x2, crop), SnakeBeta, 2x Kaiser-sinc downsample (replicate pad, depthwise
strided conv). The depthwise filters are the checkpoint's `filter` buffers, shared by every channel, so
the channels are folded into the batch and filtered with one 1-in 1-out kernel.

Weights: the convolutions are weight-normed in the checkpoint; the program declares the folded
`<name>.weight` (`dif.weights.weight_norm` folds `weight_g` / `weight_v` at load). The reference pins
the whole decoder to float32 (`_keep_in_fp32_modules`; bf16 decodes are audibly worse), so does this.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dif.dtypes import DType
from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers.signal import conv1d, conv_transpose1d, replicate_pad1d, snake
from dif_frontend_h3.vae_config import AudioVaeConfig

MODULE = "audio_vae"
F32 = DType.F32
FILTER_TAPS = 12  # the alias-free activation's Kaiser-sinc kernel
RATIO = 2  # its up / down sampling ratio


def _conv(b: ProgramBuilder, x: Var, name: str, out: int, k: int, *, dilation: int = 1, bias: bool = True) -> Var:
    """A weight-normed Conv1d with 'same' padding (k*d - d) // 2, as every decoder conv has."""
    w = b.param(f"{name}.weight", (out, x.shape[1], k), F32)
    bv = b.param(f"{name}.bias", (out,), F32) if bias else None
    pad = (k * dilation - dilation) // 2
    with b.scope(tensors=tuple(p.name for p in (w, bv) if p is not None)):
        return conv1d(b, x, w, bv, padding=(pad, pad), dilation=dilation)


def _depthwise(b: ProgramBuilder, x: Var, fn: Callable[[Var], Var]) -> Var:
    """fn over every channel of x [N, C, L] as its own 1-channel signal [N*C, 1, L]."""
    n, c, length = x.shape
    y = fn(b.emit("reshape", x, shape=(n * c, 1, length)))
    return b.emit("reshape", y, shape=(n, c, y.shape[-1]))


def _alias_free_snake(b: ProgramBuilder, x: Var, name: str) -> Var:
    """2x upsample -> SnakeBeta -> 2x downsample (MiniMaxH3AudioActivation1d)."""
    k, c = FILTER_TAPS, x.shape[1]
    up_f = b.param(f"{name}.upsample.filter", (1, 1, k), F32)
    down_f = b.param(f"{name}.downsample.lowpass.filter", (1, 1, k), F32)
    alpha = b.param(f"{name}.act.alpha", (c,), F32)
    beta = b.param(f"{name}.act.beta", (c,), F32)
    pad = k // RATIO - 1
    crop = pad * RATIO + (k - RATIO) // 2  # == pad * RATIO + (k - RATIO + 1) // 2 for an even k
    if crop != pad * RATIO + (k - RATIO + 1) // 2:
        raise DifError(f"audio VAE: the {k}-tap resampler crops unevenly")

    def up(s: Var) -> Var:
        s = replicate_pad1d(b, s, pad, pad)
        return b.emit("scalar_affine", conv_transpose1d(b, s, up_f, stride=RATIO, padding=crop), scale=float(RATIO))

    def down(s: Var) -> Var:
        s = replicate_pad1d(b, s, k // 2 - int(k % 2 == 0), k // 2)
        return conv1d(b, s, down_f, stride=RATIO)

    with b.scope(tensors=(up_f.name,)):
        h = _depthwise(b, x, up)
    with b.scope(tensors=(alpha.name, beta.name)):
        h = snake(b, h, alpha, beta, log_scale=True)
    with b.scope(tensors=(down_f.name,)):
        return _depthwise(b, h, down)


def _amp_block(b: ProgramBuilder, x: Var, name: str, kernel: int, dilations: tuple[int, ...]) -> Var:
    c = x.shape[1]
    for j, d in enumerate(dilations):
        r = _conv(
            b, _alias_free_snake(b, x, f"{name}.activations.{2 * j}"), f"{name}.convs1.{j}", c, kernel, dilation=d
        )
        r = _conv(b, _alias_free_snake(b, r, f"{name}.activations.{2 * j + 1}"), f"{name}.convs2.{j}", c, kernel)
        x = b.emit("add", r, x)
    return x


def build_audio_decoder(
    cfg: AudioVaeConfig, *, num_latents: int, batch: int = 2, dtype: DType | str = "f32"
) -> Program:
    """AutoencoderKLMiniMaxH3Audio.decode for denormalized latents.

    Input `latents` (batch, latent_channels, num_latents) float32 (stereo: batch 2, one channel each).
    Output (meta["outputs"] = "waveform"): (batch, 1, num_latents * hop_length) float32 in [-1, 1]."""
    if DType(dtype) != F32:
        raise DifError(
            f"audio VAE decoder: dtype {DType(dtype).value} refused; the reference pins the decoder to float32",
            hint="build it with dtype='f32' (it is small: the DiT's dtype does not apply)",
        )
    if num_latents < 1 or batch < 1:
        raise DifError(f"audio VAE decoder: {num_latents} latents (batch {batch}) must be positive")
    b = ProgramBuilder("h3_audio_vae_decoder")
    b.meta.update({"family": "h3", "component": "audio_vae", "dtype": "f32", "outputs": "waveform"})
    x = b.input("latents", (batch, cfg.latent_channels, num_latents), F32)
    with b.scope(module=MODULE, block="dec_in_proj", section="conv1x1"):
        x = _conv(b, x, "dec_in_proj", cfg.latent_dim, 1)
    with b.scope(module=MODULE, block="decoder.conv_pre", section="conv"):
        x = _conv(b, x, "decoder.conv_pre", cfg.decoder_dim, 7)
    kernels, nk = cfg.resblock_kernel_sizes, len(cfg.resblock_kernel_sizes)
    for i, (rate, k) in enumerate(zip(cfg.decoder_rates, cfg.decoder_kernel_sizes, strict=True)):
        name = f"decoder.ups.{i}.0"
        cin, cout = cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1)
        with b.scope(module=MODULE, block=name, section="upsample"):
            w = b.param(f"{name}.weight", (cin, cout, k), F32)
            bias = b.param(f"{name}.bias", (cout,), F32)
            with b.scope(tensors=(w.name, bias.name)):
                x = conv_transpose1d(b, x, w, bias, stride=rate, padding=(k - rate) // 2)
        total = None
        for j in range(nk):
            block = f"decoder.resblocks.{i * nk + j}"
            with b.scope(module=MODULE, block=block, section="amp"):
                y = _amp_block(b, x, block, kernels[j], cfg.resblock_dilation_sizes[j])
                total = y if total is None else b.emit("add", total, y)
        with b.scope(module=MODULE, block=f"decoder.resblocks.{i * nk}", section="mean"):
            x = b.emit("scalar_affine", total, scale=1.0 / nk)
    with b.scope(module=MODULE, block="decoder.activation_post", section="out"):
        x = _alias_free_snake(b, x, "decoder.activation_post")
    with b.scope(module=MODULE, block="decoder.conv_post", section="out"):
        x = _conv(b, x, "decoder.conv_post", 1, 7, bias=False)
        b.output(b.emit("clamp", x, lo=-1.0, hi=1.0))
    return b.build()


def denormalize_audio_latents(cfg: AudioVaeConfig, latents: np.ndarray) -> np.ndarray:
    """z * latents_std + latents_mean per channel of (B, C, A), float32 (the audio decode step)."""
    std = np.asarray(cfg.latents_std, np.float32).reshape(1, -1, 1)
    mean = np.asarray(cfg.latents_mean, np.float32).reshape(1, -1, 1)
    return np.asarray(latents, np.float32) * std + mean


def decode_audio(
    cfg: AudioVaeConfig,
    latents: np.ndarray,
    run: Callable[[dict[str, np.ndarray]], np.ndarray],
    *,
    normalized: bool = True,
) -> np.ndarray:
    """Audio latents (channels, C, A) -> waveform (channels, A * hop) float32 at cfg.sampling_rate,
    as the H3 audio decode step does (denormalize unless `normalized=False`, one batch item per stereo
    channel). `run` executes `build_audio_decoder(cfg, num_latents=A, batch=channels)` on its inputs."""
    if latents.ndim != 3 or latents.shape[1] != cfg.latent_channels:
        raise DifError(f"audio VAE decode: latents must be (channels, {cfg.latent_channels}, A), got {latents.shape}")
    z = denormalize_audio_latents(cfg, latents) if normalized else np.asarray(latents, np.float32)
    wave = np.asarray(run({"latents": np.ascontiguousarray(z)}), dtype=np.float32)
    return wave[:, 0]
