"""FLUX.2 [klein] text-to-image: prompt -> Qwen3 features -> flow-match Euler loop -> VAE -> pixels.

Frontend stage, the whole product path. Three DiffIR programs (text encoder, denoiser, VAE decoder
with BatchNorm de-normalisation and unpatchify folded in) are built for the requested shape,
bound to the checkpoint and prepared on a backend once; the sampling loop (`dif.kit.sampling`)
runs on the host over `predictor`, the one model-specific step:
  sigmas = linspace(1, 1/n, n), shifted with mu = empirical_mu(image tokens, n) (exponential shift)
  per step: velocity = denoiser(latents, t) [, CFG: v_u + g (v_c - v_u) with negative prompt]
            latents  = latents + (sigma_next - sigma) * velocity, stored in the run dtype
The token size (pixels per token) comes from the checkpoint's VAE and patch configs. Every
rounding follows Flux2KleinPipeline (diffusers) so an fp32 run from the same initial noise
reproduces its latents and image; `--init-noise` supplies that noise, seeds use numpy's PCG64.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np
from attrs import define, field, frozen

from dif.checkpoint import native_size
from dif.dtypes import DType
from dif.errors import CheckpointError, UsageError
from dif.image_pipeline import ImageRequest, TextToImagePipeline
from dif.ir.program import Program
from dif.kit.admission import admit_image
from dif.kit.finite import require_finite
from dif.kit.sampling import Predict, StepCallback
from dif.kit.scheduler import FlowMatchConfig, load_scheduler_config
from dif.media import to_uint8
from dif.noise import initial_latents
from dif.program_cache import ProgramCache
from dif.runtime import Runner
from dif.sched import FlowMatchSchedule
from dif.weights import TensorSource, bind_weights
from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj
from dif_frontend_flux2.plugin import INFO
from dif_frontend_flux2.text_encoder import KLEIN_TAPS, build_text_encoder, qwen3_rope_tables
from dif_frontend_flux2.tokenize import MAX_LENGTH, load_tokenizer, tokenize_prompts
from dif_frontend_flux2.vae import build_vae_decoder
from dif_frontend_flux2.weights import VAE_DECODER_UNUSED, Flux2Checkpoint, text_encoder_unused

KLEIN_SCHEDULER = FlowMatchConfig(shift=3.0, use_dynamic_shifting=True)
"""klein's scheduler when a checkpoint ships no scheduler/scheduler_config.json (its published one)."""


def empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """The FLUX.2 resolution- and step-dependent shift `mu`: two fitted lines in the token count
    (fits at 10 and 200 steps), interpolated linearly in the step count; above 4300 tokens only
    the 200-step line. Float operations in the reference order (mu feeds exp())."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    m200 = a2 * image_seq_len + b2
    if image_seq_len > 4300:
        return float(m200)
    m10 = a1 * image_seq_len + b1
    slope = (m200 - m10) / 190.0
    intercept = m200 - 200.0 * slope
    return float(slope * num_steps + intercept)


def klein_schedule(n_img: int, steps: int, config: FlowMatchConfig = KLEIN_SCHEDULER) -> FlowMatchSchedule:
    """Sigmas linspace(1, 1/steps, steps), shifted as Flux2KleinPipeline + its scheduler do: with
    dynamic shifting by mu = empirical_mu(image tokens, steps), otherwise by the static `shift`."""
    return config.schedule(steps, mu=empirical_mu(n_img, steps))


def check_size(width: int, height: int, pixels_per_token: int) -> tuple[int, int]:
    """(tokens high, tokens wide); `UsageError` unless both are positive multiples of the token size."""
    ppt = pixels_per_token
    for name, value in (("width", width), ("height", height)):
        if value <= 0 or value % ppt:
            lo = max(ppt, value // ppt * ppt)
            raise UsageError(
                f"{name} {value} is not a positive multiple of {ppt}",
                hint=f"this checkpoint works on {ppt}x{ppt}-pixel tokens; try {lo} or {lo + ppt}",
            )
    return height // ppt, width // ppt


def pack_noise(noise: np.ndarray) -> np.ndarray:
    """(B, C, h, w) -> (B, h*w, C), tokens row-major, as the reference packs latents."""
    b, c, h, w = noise.shape
    return np.ascontiguousarray(noise.reshape(b, c, h * w).transpose(0, 2, 1))


@frozen
class GenerationRequest(ImageRequest):
    """One FLUX.2 text-to-image job. None settings take the checkpoint's defaults (see `resolve`;
    the values: `plugin.INFO`). `init_noise`: (B, 128, H/16, W/16) or packed (B, N, 128) at 16
    pixels per token."""


@define
class Flux2Pipeline(TextToImagePipeline):
    """Runs one checkpoint at one dtype on one backend; programs are cached per shape."""

    checkpoint: Flux2Checkpoint
    dtype: DType = DType.F32
    backend: str | None = None  # a dif backend name, None for the default, "interp" for the reference interpreter
    on_step: StepCallback | None = None
    on_stage: Callable[[str, float], None] | None = None
    vram_budget: int | None = None  # device bytes the whole pipeline may hold (`ProgramCache`)
    _programs: ProgramCache = field(init=False)
    _tokenizer: Any = field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.checkpoint.configs.transformer.guidance_embeds:
            raise CheckpointError(
                f"{self.checkpoint.root}: transformer has guidance_embeds=true (FLUX.2 [dev]); "
                "this pipeline runs [klein]"
            )
        self._programs = ProgramCache(self.backend, vram_budget=self.vram_budget)

    @property
    def pixels_per_token(self) -> int:
        return self.checkpoint.configs.pixels_per_token

    @property
    def native_size(self) -> int:
        return native_size(self.checkpoint.root, multiple=self.pixels_per_token)

    # -- programs ------------------------------------------------------------------------------
    def _runner(
        self, key: Hashable, build: Callable[[], Program], source: TensorSource, ignore: Any, stage: str
    ) -> Runner:
        def build_and_bind() -> tuple[Program, Mapping[str, np.ndarray]]:
            program = build()
            return program, bind_weights(program, source, ignore=ignore)

        return self._programs.get(key, build_and_bind, stage)

    def prepare_all(self, width: int, height: int) -> None:
        """Build, bind and plan the three programs for this size now (the CLI's load stage)."""
        h, w = check_size(width, height, self.pixels_per_token)
        self._text_runner()
        self._transformer_runner(h * w)
        self._vae_runner(h, w)

    def _text_runner(self) -> Runner:
        cfg = self.checkpoint.configs.text_encoder
        taps = KLEIN_TAPS
        if max(taps) > cfg.num_hidden_layers:
            raise CheckpointError(f"text encoder has {cfg.num_hidden_layers} layers; klein taps layers {taps}")
        return self._runner(
            ("text",),
            lambda: build_text_encoder(cfg, batch=1, seq_len=MAX_LENGTH, taps=taps, dtype=self.dtype),
            self.checkpoint.text_encoder,
            text_encoder_unused(max(taps), cfg.num_hidden_layers),
            "encode",
        )

    def _transformer_runner(self, n_img: int) -> Runner:
        cfg = self.checkpoint.configs.transformer
        return self._runner(
            ("transformer", n_img),
            lambda: build_transformer(cfg, batch=1, n_img=n_img, n_txt=MAX_LENGTH, dtype=self.dtype),
            self.checkpoint.transformer,
            (),
            "denoise",
        )

    def _vae_runner(self, h: int, w: int) -> Runner:
        cfg = self.checkpoint.configs.vae
        ph, pw = cfg.patch_size  # one token is a patch of latent pixels
        return self._runner(
            ("vae", h, w),
            lambda: build_vae_decoder(
                cfg, batch=1, latent_h=ph * h, latent_w=pw * w, dtype=self.dtype, from_packed=True
            ),
            self.checkpoint.vae,
            VAE_DECODER_UNUSED,
            "decode",
        )

    # -- stages --------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.checkpoint.tokenizer_dir)
        return self._tokenizer

    def encode(self, prompt: str) -> np.ndarray:
        """Text features (1, 512, 3 * hidden) in the run dtype: [h9 | h18 | h27] per token, pads included."""
        cfg = self.checkpoint.configs.text_encoder
        ids, mask = tokenize_prompts(self.tokenizer, [prompt])
        cos, sin = qwen3_rope_tables(cfg, MAX_LENGTH, dtype=self.dtype)
        run = self._text_runner()
        out = run({"input_ids": ids, "attention_mask": mask, "rope_cos": cos, "rope_sin": sin})
        return require_finite("text features", next(iter(out.values())))

    def predictor(self, h: int, w: int) -> Predict:
        """The denoiser at h x w tokens: (latents (1, h*w, 128), t, text features) -> velocity."""
        cfg = self.checkpoint.configs.transformer
        run = self._transformer_runner(h * w)
        cos, sin = flux2_rope_tables(MAX_LENGTH, h, w, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)

        def predict(latents: np.ndarray, t: float, text: np.ndarray) -> np.ndarray:
            t_proj = flux2_timestep_proj([t], dtype=self.dtype, channels=cfg.timestep_guidance_channels)
            inputs = {
                "latents": latents,
                "text_features": text,
                "timestep_proj": t_proj,
                "rope_cos": cos,
                "rope_sin": sin,
            }
            return next(iter(run(inputs).values()))

        return predict

    def decode(self, latents: np.ndarray, h: int, w: int) -> np.ndarray:
        """(H, W, 3) uint8 from packed latents, rounded as the reference image processor does."""
        image = next(iter(self._vae_runner(h, w)({"latents": latents}).values()))
        return to_uint8(require_finite("decoded image", image)[0])

    # -- the whole path ------------------------------------------------------------------------
    def resolve(self, req: GenerationRequest) -> tuple[int, float, bool, list[str]]:
        """(steps, guidance, use_cfg, warnings) with the distilled/base defaults and rules; the size
        must be a multiple of the token size (`UsageError`)."""
        self.fit_size(*self.size(req))
        warnings: list[str] = []
        distilled = self.checkpoint.is_distilled
        kind = self.checkpoint.kind
        steps = req.steps if req.steps is not None else INFO.default("steps", kind)
        if steps < 1:
            raise UsageError(f"steps must be at least 1, got {steps}")
        guidance = req.guidance if req.guidance is not None else INFO.default("guidance", kind)
        if distilled and req.guidance is not None and req.guidance > 1.0:
            warnings.append(f"guidance {req.guidance} is ignored: this checkpoint is step-distilled (no CFG)")
        if distilled and req.negative_prompt:
            warnings.append("the negative prompt is ignored: this checkpoint is step-distilled (no CFG)")
        use_cfg = guidance > 1.0 and not distilled
        if not use_cfg and not distilled and req.negative_prompt:
            warnings.append(f"the negative prompt is ignored: CFG is off at guidance {guidance} (needs > 1)")
        channels = self.checkpoint.configs.transformer.in_channels
        admit_image(
            *self.size(req), pixels_per_token=self.pixels_per_token, channels=channels, steps=steps, cfg=use_cfg,
            dtype=self.dtype, schedule=self.schedule, guidance=guidance,
        )  # fmt: skip
        return steps, guidance, use_cfg, warnings

    def initial_noise(self, req: GenerationRequest, h: int, w: int) -> np.ndarray:
        """Packed initial latents (1, h*w, 128) in the run dtype, from the seed or `init_noise`."""
        c = self.checkpoint.configs.transformer.in_channels
        return initial_latents(
            req.init_noise,
            req.seed,
            unpacked=(1, c, h, w),
            packed=(1, h * w, c),
            pack=pack_noise,
            dtype=self.dtype,
            what=f"{w * self.pixels_per_token}x{h * self.pixels_per_token}",
        )

    def fit_size(self, width: int, height: int) -> tuple[int, int, list[str]]:
        """The size itself: `UsageError` unless it is on the token grid."""
        check_size(width, height, self.pixels_per_token)
        return width, height, []

    def schedule(self, image_tokens: int, steps: int) -> FlowMatchSchedule:
        return klein_schedule(image_tokens, steps, load_scheduler_config(self.checkpoint.root, missing=KLEIN_SCHEDULER))

    def run_keys(self) -> dict[str, Any]:
        ck = self.checkpoint
        return {"model": ck.name, "distilled": ck.is_distilled, "layout": ck.layout}
