"""SD-Turbo text-to-image: prompt -> CLIP -> UNet (Euler over the discrete schedule) -> VAE or TAESD -> pixels.

Frontend stage, the whole product path. Three DiffIR programs (text encoder at 77 tokens, UNet at
the latent size, decoder) are built for the requested shape, bound to the checkpoint and prepared on
a backend once. The loop is StableDiffusionPipeline's with EulerDiscreteScheduler
(`dif_frontend_sdturbo.sampling`):
  x = randn * init_noise_sigma; per step: eps = unet(x / sqrt(sigma^2 + 1), t, text)
  [CFG when guidance > 1: eps = eps_u + g (eps_c - eps_u), negative prompt ""];  x = euler_step(x, eps)
  image = vae.decode(x / 0.18215), or with `fast_vae` taesd(x) (raw latents, output in [0, 1]).
SD-Turbo: 1 step at t = 999, guidance 0 (no CFG). A one-step run without CFG of one image runs as one
program instead (`dif_frontend_sdturbo.one_step`: the same math, the intermediates kept on the device).
An fp32 run from the same noise reproduces diffusers' latents and image; seeds use numpy's PCG64
(`dif.noise`) or torch's streams (--rng).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from attrs import define, field, frozen

from dif.dtypes import DType
from dif.errors import UsageError
from dif.image_pipeline import ImageConditioning, ImageRequest, StageTimer, TextToImagePipeline
from dif.ir.program import Program
from dif.kit.admission import admit_image
from dif.kit.finite import require_finite, require_finite_probe
from dif.kit.sampling import Predict, StepCallback
from dif.noise import initial_latents
from dif.program_cache import ProgramCache
from dif.runtime import Runner
from dif.sched import FlowMatchSchedule, cfg_combine
from dif.weights.bind import PrefixedWeights, prefixed_scans
from dif_frontend_sdturbo import one_step
from dif_frontend_sdturbo.config import SdConfigs
from dif_frontend_sdturbo.plugin import INFO
from dif_frontend_sdturbo.sampling import discrete_schedule, euler_step, init_noise_sigma, scale_model_input
from dif_frontend_sdturbo.taesd import build_taesd_decoder
from dif_frontend_sdturbo.text_encoder import build_text_encoder
from dif_frontend_sdturbo.tokenize import ClipTokenizer
from dif_frontend_sdturbo.unet import build_unet, timestep_features
from dif_frontend_sdturbo.vae import build_vae_decoder, vae_latents
from dif_frontend_sdturbo.weights import SdCheckpoint, bind_taesd, bind_text_encoder, bind_unet, bind_vae

CFG_ABOVE = 1.0  # diffusers runs CFG when guidance_scale > 1 (1 is the conditional prediction alone)


def round_size(width: int, height: int, multiple: int) -> tuple[int, int, list[str]]:
    """(width, height) rounded up to multiples of `multiple` (VAE factor x UNet downsampling), with a warning each."""
    if width <= 0 or height <= 0:
        raise UsageError(f"image size {width}x{height} must be positive")
    out, warnings = [], []
    for name, value in (("width", width), ("height", height)):
        rounded = -(-value // multiple) * multiple
        if rounded != value:
            warnings.append(
                f"{name} {value} rounded up to {rounded} (this UNet works on multiples of {multiple} pixels)"
            )
        out.append(rounded)
    return out[0], out[1], warnings


def pack_latents(latents: np.ndarray) -> np.ndarray:
    """(B, C, h, w) -> (B, h*w, C): the kit's token layout (one latent pixel per token, row-major), which
    previews, --save-latents and `ImageRun.latents` use."""
    b, c, h, w = latents.shape
    return np.ascontiguousarray(latents.reshape(b, c, h * w).transpose(0, 2, 1))


def unpack_latents(packed: np.ndarray, h: int, w: int) -> np.ndarray:
    """(B, h*w, C) -> (B, C, h, w), the inverse of `pack_latents` (diffusers' `latents` layout)."""
    b, _, c = packed.shape
    return np.ascontiguousarray(packed.transpose(0, 2, 1).reshape(b, c, h, w))


@frozen(eq=False)
class EncodedPrompt:
    """Text conditioning for the UNet: (1, 77, cross_dim) in the run dtype."""

    embeds: np.ndarray
    ids: np.ndarray


@define
class SdPipeline(TextToImagePipeline):
    """Runs one checkpoint at one dtype on one backend; programs are cached per shape. `fast_vae`
    decodes with the checkpoint's TAESD instead of the KL VAE."""

    checkpoint: SdCheckpoint
    dtype: DType = DType.F32
    backend: str | None = None  # a dif backend name, None for the default, "interp" for the reference interpreter
    fast_vae: bool = False
    on_step: StepCallback | None = None
    on_stage: Callable[[str, float], None] | None = None
    vram_budget: int | None = None
    max_length: int = 77
    one_program: bool = True  # a one-step run without CFG of one image, without a VRAM budget: one program
    _programs: ProgramCache = field(init=False)
    _tokenizer: ClipTokenizer | None = field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.fast_vae and self.checkpoint.taesd is None:
            raise UsageError(
                f"--fast-vae needs a TAESD for {self.checkpoint.name}",
                hint="pass --taesd FOLDER_OR_FILE (madebyollin/taesd), or put a taesd/ folder in the checkpoint",
            )
        self.max_length = min(self.max_length, self.configs.text_encoder.max_position_embeddings)
        self._programs = ProgramCache(self.backend, vram_budget=self.vram_budget)

    @property
    def configs(self) -> SdConfigs:
        return self.checkpoint.configs

    @property
    def pixels_per_token(self) -> int:
        return self.configs.pixels_per_token

    @property
    def native_size(self) -> int:
        """unet sample_size x VAE factor, as StableDiffusionPipeline's default (512 for SD-Turbo)."""
        return self.configs.unet.sample_size * self.configs.vae.scale_factor

    @property
    def vae_dtype(self) -> DType:
        """The KL decoder's dtype: the run dtype. StableDiffusionPipeline decodes in the VAE's own dtype
        (its `force_upcast` is read by the SDXL pipelines only), so dif does too."""
        return self.dtype

    # -- programs ------------------------------------------------------------------------------
    def _text_encoder(self) -> tuple[Program, Mapping[str, np.ndarray]]:
        prog = build_text_encoder(self.configs.text_encoder, seq_len=self.max_length, dtype=self.dtype)
        return prog, bind_text_encoder(prog, self.checkpoint.text_encoder)

    def _unet(self, h: int, w: int, batch: int) -> tuple[Program, Mapping[str, np.ndarray]]:
        cfg = self.configs.unet
        prog = build_unet(cfg, latent_h=h, latent_w=w, text_len=self.max_length, batch=batch, dtype=self.dtype)
        return prog, bind_unet(prog, self.checkpoint.unet)

    def _decoder(self, h: int, w: int, pixels: bool) -> tuple[Program, Mapping[str, np.ndarray]]:
        """The decoder at this latent size; with `pixels` it ends in the picture's 8-bit pixels and their
        finiteness probe (`dif.layers.pixels`: made on the device, as `to_uint8` would on the host)."""
        taesd = self.checkpoint.taesd
        if self.fast_vae and taesd is not None:
            prog = build_taesd_decoder(taesd.config, latent_h=h, latent_w=w, dtype=self.dtype, pixels=pixels)
            return prog, bind_taesd(prog, taesd.source)
        prog = build_vae_decoder(self.configs.vae, latent_h=h, latent_w=w, dtype=self.vae_dtype, pixels=pixels)
        return prog, bind_vae(prog, self.checkpoint.vae)

    def _text_runner(self) -> Runner:
        return self._programs.get(("text_encoder", self.max_length), self._text_encoder, "encode")

    def _unet_runner(self, h: int, w: int, batch: int) -> Runner:
        return self._programs.get(("unet", h, w, batch), lambda: self._unet(h, w, batch), "denoise")

    def _decoder_runner(self, h: int, w: int, *, pixels: bool = True) -> Runner:
        key = ("taesd" if self.fast_vae else "vae", h, w, "pixels" if pixels else "image")
        return self._programs.get(key, lambda: self._decoder(h, w, pixels), "decode")

    def _one_step_runner(self, h: int, w: int, schedule: FlowMatchSchedule) -> Runner:
        """The whole one-step path at this latent size as one program (`one_step.build_one_step`)."""
        sigma, sigma_next = float(schedule.sigmas[0]), float(schedule.sigmas[1])
        init_sigma = float(init_noise_sigma(self.configs.scheduler, schedule))
        vae = self.configs.vae
        scale, shift = (1.0, 0.0) if self.fast_vae else (1.0 / vae.scaling_factor, vae.shift_factor or 0.0)

        def build() -> tuple[Program, Mapping[str, np.ndarray]]:
            builders = {
                one_step.TEXT: self._text_encoder,
                one_step.UNET: lambda: self._unet(h, w, 1),
                one_step.DECODER: lambda: self._decoder(h, w, pixels=True),
            }
            parts = {}
            for prefix, part in builders.items():
                with prefixed_scans(prefix):  # the weight scans name the parameters of the one program
                    parts[prefix] = part()
            prog = one_step.build_one_step(
                *(p for p, _ in parts.values()), init_sigma=init_sigma, sigma=sigma, sigma_next=sigma_next,
                latent_scale=scale, latent_shift=shift,
            )  # fmt: skip
            return prog, PrefixedWeights({prefix: wts for prefix, (_, wts) in parts.items()})

        key = ("one_step", "taesd" if self.fast_vae else "vae", h, w, sigma, sigma_next, init_sigma)
        return self._programs.get(key, build, "denoise")

    def runs_one_program(self, req: ImageRequest) -> bool:
        """Whether `req` runs as one program: one step, no CFG, one image, no VRAM budget (which may need
        the stages apart, each resident in turn)."""
        steps, guidance = self.steps_and_guidance(req)
        return self.one_program and steps == 1 and guidance <= CFG_ABOVE and req.batch == 1 and self.vram_budget is None

    def prepare_all(self, width: int, height: int, req: ImageRequest | None = None) -> None:
        """Build, bind and plan every program for this (already rounded) size and `req`'s batch now."""
        h, w = height // self.pixels_per_token, width // self.pixels_per_token
        if req is not None and self.runs_one_program(req):
            self._one_step_runner(h, w, self.schedule(h * w, 1))
            return
        self._text_runner()
        self._unet_runner(h, w, 1 if req is None else req.batch)
        self._decoder_runner(h, w)

    # -- stages --------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> ClipTokenizer:
        if self._tokenizer is None:
            self._tokenizer = ClipTokenizer.from_folder(self.checkpoint.tokenizer_dir)
        return self._tokenizer

    def token_ids(self, prompt: str) -> np.ndarray:
        """(1, 77) CLIP token ids of `prompt`, padded; `UsageError` for an id the text encoder lacks."""
        ids = self.tokenizer.encode_padded(prompt, self.max_length)
        vocab = self.configs.text_encoder.vocab_size
        if int(ids.max()) >= vocab:
            raise UsageError(
                f"token id {int(ids.max())} is outside the text encoder's {vocab}-token vocabulary",
                hint=f"the tokenizer in {self.checkpoint.tokenizer_dir} belongs to another model",
            )
        return ids

    def encode(self, prompt: str) -> EncodedPrompt:
        """CLIP's last_hidden_state of `prompt` padded to 77 tokens, (1, 77, hidden) in the run dtype."""
        ids = self.token_ids(prompt)
        out = self._text_runner()({"input_ids": ids})
        return EncodedPrompt(require_finite("text features", next(iter(out.values()))), ids)

    def predictor(self, grid_h: int, grid_w: int, images: Any = None) -> Predict:
        """The UNet at this latent size: (scaled latents (B, 4, h, w), timestep, `EncodedPrompt`) -> eps."""
        cfg = self.configs.unet

        def predict(sample: np.ndarray, t: float, prompt: EncodedPrompt) -> np.ndarray:
            batch = sample.shape[0]
            run = self._unet_runner(grid_h, grid_w, batch)
            proj = timestep_features(cfg, [t] * batch).astype(self.dtype.np)
            text = np.repeat(prompt.embeds, batch, axis=0)
            return next(iter(run({"sample": sample, "timestep_proj": proj, "text": text}).values()))

        return predict

    def denoise(
        self,
        noise: np.ndarray,
        cond: Any,
        uncond: Any,
        schedule: FlowMatchSchedule,
        guidance: float,
        grid_h: int,
        grid_w: int,
        images: ImageConditioning | None = None,
    ) -> np.ndarray:
        """Packed latents (B, h*w, 4) after Euler over `schedule` from packed unit `noise` (scaled by
        init_noise_sigma here); the UNet runs on them unpacked (B, 4, h, w)."""
        predict = self.predictor(grid_h, grid_w)
        dt = self.dtype.np
        sigma0 = init_noise_sigma(self.configs.scheduler, schedule)
        x = (unpack_latents(noise, grid_h, grid_w).astype(np.float32) * sigma0).astype(dt)
        total = schedule.num_steps
        for i, t in enumerate(schedule.timesteps):
            sigma, nxt = schedule.sigmas[i], schedule.sigmas[i + 1]
            model_in = scale_model_input(x, sigma)
            eps = require_finite("UNet output", predict(model_in, t, cond), step=(i + 1, total))
            if uncond is not None:
                eps_u = require_finite(
                    "UNet output (negative prompt)", predict(model_in, t, uncond), step=(i + 1, total)
                )
                eps = cfg_combine(eps, eps_u, guidance, base="uncond")
            x = require_finite("latents", euler_step(x, eps, sigma, nxt), step=(i + 1, total))
            if self.on_step is not None:
                self.on_step(i + 1, total, pack_latents(x))
        return pack_latents(x)

    def decode_image(self, latents: np.ndarray) -> np.ndarray:
        """(1, 3, H, W) from unpacked latents (1, 4, h, w): the KL decoder's output in [-1, 1], or TAESD's
        in [0, 1] with `fast_vae`."""
        return next(iter(self._decode(latents, pixels=False).values()))

    def _decode(self, latents: np.ndarray, *, pixels: bool) -> dict[str, np.ndarray]:
        h, w = latents.shape[2:]
        run = self._decoder_runner(h, w, pixels=pixels)
        if self.fast_vae:
            return run({"latent": latents.astype(self.dtype.np)})
        return run({"latent": vae_latents(self.configs.vae, latents).astype(self.vae_dtype.np)})

    def decode(self, latents: np.ndarray, grid_h: int, grid_w: int) -> np.ndarray:
        """(H, W, 3) uint8 from packed latents (1, h*w, 4), rounded as the reference image processor does
        (`to_uint8`), on the decoder's backend; a non-finite picture is refused as the host check would."""
        pixels, probe = self._decode(unpack_latents(latents, grid_h, grid_w), pixels=True).values()
        require_finite_probe("decoded image", probe)
        return pixels

    def render(
        self,
        req: ImageRequest,
        timer: StageTimer,
        *,
        noise: np.ndarray,
        schedule: FlowMatchSchedule,
        guidance: float,
        cfg: bool,
        grid: tuple[int, int],
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The stages apart (`TextToImagePipeline.render`), or, for a request that `runs_one_program`, the
        one-step program: "encode" tokenizes, "denoise" runs the text encoder, the UNet, the Euler step and
        the decoder on the device, "decode" checks the picture's probe. Each stage's probe is checked in
        order, so a non-finite stage is named as when the stages run apart."""
        if not self.runs_one_program(req):  # decided as `prepare_all` decided what to prepare
            return super().render(req, timer, noise=noise, schedule=schedule, guidance=guidance, cfg=cfg, grid=grid)
        h, w = grid
        self.enter_stage(timer, "encode")
        with timer.stage("encode"):
            ids = self.token_ids(req.prompt)
            proj = timestep_features(self.configs.unet, [schedule.timesteps[0]]).astype(self.dtype.np)
        self.enter_stage(timer, "denoise")
        with timer.stage("denoise"):
            inputs = {"input_ids": ids, "noise": unpack_latents(noise, h, w), "timestep_proj": proj}
            pixels, image_probe, latents, text_probe, eps_probe = self._one_step_runner(h, w, schedule)(inputs).values()
            require_finite_probe("text features", text_probe)
            require_finite_probe("UNet output", eps_probe, step=(1, 1))
            packed = require_finite("latents", pack_latents(latents), step=(1, 1))
            if self.on_step is not None:
                self.on_step(1, 1, packed)
        self.enter_stage(timer, "decode")
        with timer.stage("decode"):
            require_finite_probe("decoded image", image_probe)
        return packed, [pixels]

    # -- the whole path ------------------------------------------------------------------------
    def steps_and_guidance(self, req: ImageRequest) -> tuple[int, float]:
        """`req`'s steps and guidance, the checkpoint kind's defaults (turbo / base) where it gives none."""
        kind = self.configs.kind
        steps = req.steps if req.steps is not None else INFO.default("steps", kind)
        return steps, req.guidance if req.guidance is not None else INFO.default("guidance", kind)

    def resolve(self, req: ImageRequest) -> tuple[int, float, bool, list[str]]:
        """(steps, guidance, use_cfg, warnings) with the turbo / base defaults; CFG when guidance > 1
        (diffusers' rule), a warning for any guidance on SD-Turbo."""
        self.check_model_inputs(req)
        width, height, warnings = self.fit_size(*self.size(req))
        steps, guidance = self.steps_and_guidance(req)
        if steps < 1:
            raise UsageError(f"steps must be at least 1, got {steps}")
        if guidance < 0:
            raise UsageError(f"guidance must be >= 0 (CFG runs above 1), got {guidance}")
        use_cfg = guidance > CFG_ABOVE
        if self.checkpoint.is_turbo and guidance > 0:
            effect = "runs CFG (twice the UNet work)" if use_cfg else "has no effect (CFG runs only above 1)"
            warnings.append(
                f"guidance {guidance} on SD-Turbo {effect}: the model is distilled for guidance 0 "
                "(1-4 steps, no CFG); CFG over-saturates its images"
            )
        if self.checkpoint.is_turbo and steps > 4:
            warnings.append(f"{steps} steps on SD-Turbo: it is distilled for 1-4 steps")
        if not use_cfg and req.negative_prompt:
            warnings.append("the negative prompt is ignored: CFG is off at guidance <= 1")
        if req.sampler != "euler" or req.scheduler != "simple":
            raise UsageError("SD checkpoints sample with Euler over their own schedule (euler / simple)")
        admit_image(
            width, height, pixels_per_token=self.pixels_per_token, channels=self.configs.unet.in_channels,
            steps=steps, cfg=use_cfg, dtype=self.dtype, schedule=self.schedule, guidance=guidance, batch=req.batch,
        )  # fmt: skip
        return steps, guidance, use_cfg, warnings

    def initial_noise(self, req: ImageRequest, grid_h: int, grid_w: int) -> np.ndarray:
        """Packed unit initial latents (B, h*w, 4) in the run dtype: image i from seed + i (drawn as
        diffusers' (B, 4, h, w) `latents`), or `init_noise` in either layout."""
        c, b = self.configs.unet.in_channels, req.batch
        what = f"{grid_w * self.pixels_per_token}x{grid_h * self.pixels_per_token}"

        def draw(init: np.ndarray | None, seed: int, rows: int) -> np.ndarray:
            return initial_latents(
                init, seed, unpacked=(rows, c, grid_h, grid_w), packed=(rows, grid_h * grid_w, c), pack=pack_latents,
                dtype=self.dtype, what=what, rng=req.rng,
            )  # fmt: skip

        if req.init_noise is not None or b == 1:
            return draw(req.init_noise, req.seed, b)
        return np.concatenate([draw(None, req.seed + i, 1) for i in range(b)], axis=0)

    def fit_size(self, width: int, height: int) -> tuple[int, int, list[str]]:
        return round_size(width, height, self.configs.size_multiple)

    def schedule(self, image_tokens: int, steps: int) -> FlowMatchSchedule:
        return discrete_schedule(self.configs.scheduler, steps)

    def run_keys(self) -> dict[str, Any]:
        ck = self.checkpoint
        keys: dict[str, Any] = {"model": ck.name, "variant": ck.kind}
        keys["vae"] = f"taesd ({ck.taesd.name})" if self.fast_vae and ck.taesd is not None else "autoencoder_kl"
        return keys
