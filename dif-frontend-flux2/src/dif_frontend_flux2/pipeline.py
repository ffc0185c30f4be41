"""FLUX.2 [klein] text-to-image: prompt -> Qwen3 features -> flow-match Euler loop -> VAE -> pixels.

Frontend stage, the whole product path. Three DiffIR programs (text encoder, denoiser, VAE decoder
with BatchNorm de-normalisation and unpatchify folded in) are built for the requested shape,
bound to the checkpoint and prepared on a backend once; the sampling loop runs on the host:
  sigmas = linspace(1, 1/n, n), shifted with mu = empirical_mu(image tokens, n) (exponential shift)
  per step: velocity = denoiser(latents, t) [, CFG: v_u + g (v_c - v_u) with negative prompt]
            latents  = latents + (sigma_next - sigma) * velocity, stored in the run dtype
Every rounding follows Flux2KleinPipeline (diffusers) so an fp32 run from the same initial noise
reproduces its latents and image; `--init-noise` supplies that noise, seeds use numpy's PCG64.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from attrs import define, field, frozen

from dif.dtypes import DType
from dif.errors import CheckpointError, UsageError
from dif.ir.program import Program
from dif.media import to_uint8
from dif.noise import gaussian_noise
from dif.sched import FlowMatchSchedule, cfg_combine, euler_step, flow_match_schedule
from dif.weights import TensorSource, bind_weights
from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj
from dif_frontend_flux2.text_encoder import KLEIN_TAPS, build_text_encoder, qwen3_rope_tables
from dif_frontend_flux2.tokenize import MAX_LENGTH, load_tokenizer, tokenize_prompts
from dif_frontend_flux2.vae import build_vae_decoder
from dif_frontend_flux2.weights import VAE_DECODER_UNUSED, Flux2Checkpoint, text_encoder_unused

PIXELS_PER_TOKEN = 16  # VAE 8x times the 2x2 patch
DISTILLED_STEPS, BASE_STEPS, BASE_GUIDANCE = 4, 50, 4.0
Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


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


@frozen
class SchedulerSettings:
    """The parts of scheduler/scheduler_config.json that change the numbers (klein: dynamic, exponential)."""

    dynamic: bool = True
    shift_type: str = "exponential"
    shift: float = 3.0
    num_train_timesteps: int = 1000


_UNSUPPORTED_SCHEDULER_FLAGS = (
    "use_karras_sigmas",
    "use_exponential_sigmas",
    "use_beta_sigmas",
    "invert_sigmas",
    "stochastic_sampling",
    "shift_terminal",
)


def load_scheduler_settings(root: Path) -> SchedulerSettings:
    """Read a checkpoint's FlowMatchEulerDiscreteScheduler config (klein defaults when absent);
    options dif does not implement are a `CheckpointError` rather than silently different sigmas."""
    path = root / "scheduler" / "scheduler_config.json"
    if not path.is_file():
        return SchedulerSettings()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read scheduler config ({exc})") from None
    name = data.get("_class_name", "FlowMatchEulerDiscreteScheduler")
    if name != "FlowMatchEulerDiscreteScheduler":
        raise CheckpointError(
            f"{path}: scheduler {name!r} is not supported (FLUX.2 uses FlowMatchEulerDiscreteScheduler)"
        )
    bad = [k for k in _UNSUPPORTED_SCHEDULER_FLAGS if data.get(k)]
    if bad:
        raise CheckpointError(f"{path}: scheduler options {', '.join(bad)} are not supported by dif")
    return SchedulerSettings(
        bool(data.get("use_dynamic_shifting", True)),
        str(data.get("time_shift_type", "exponential")),
        float(data.get("shift", 3.0)),
        int(data.get("num_train_timesteps", 1000)),
    )


def klein_schedule(n_img: int, steps: int, settings: SchedulerSettings = SchedulerSettings()) -> FlowMatchSchedule:
    """Sigmas linspace(1, 1/steps, steps), shifted as Flux2KleinPipeline + its scheduler do: with
    dynamic shifting by mu = empirical_mu(image tokens, steps), otherwise by the static `shift`."""
    mu = empirical_mu(n_img, steps) if settings.dynamic else None
    return flow_match_schedule(
        steps,
        mu=mu,
        shift=settings.shift,
        shift_type=settings.shift_type,
        num_train_timesteps=settings.num_train_timesteps,
    )


def check_size(width: int, height: int) -> tuple[int, int]:
    """(tokens high, tokens wide); `UsageError` unless both are positive multiples of 16."""
    for name, value in (("width", width), ("height", height)):
        if value <= 0 or value % PIXELS_PER_TOKEN:
            lo = max(PIXELS_PER_TOKEN, value // PIXELS_PER_TOKEN * PIXELS_PER_TOKEN)
            raise UsageError(
                f"{name} {value} is not a positive multiple of {PIXELS_PER_TOKEN}",
                hint=f"FLUX.2 works on 16x16-pixel tokens; try {lo} or {lo + PIXELS_PER_TOKEN}",
            )
    return height // PIXELS_PER_TOKEN, width // PIXELS_PER_TOKEN


def pack_noise(noise: np.ndarray) -> np.ndarray:
    """(B, C, h, w) -> (B, h*w, C), tokens row-major, as the reference packs latents."""
    b, c, h, w = noise.shape
    return np.ascontiguousarray(noise.reshape(b, c, h * w).transpose(0, 2, 1))


@frozen
class GenerationRequest:
    """One text-to-image job; None settings take the checkpoint's defaults (see `resolve`)."""

    prompt: str
    negative_prompt: str = ""
    steps: int | None = None  # None: 4 distilled, 50 base
    guidance: float | None = None  # None: 1 (off) distilled, 4.0 base
    seed: int = 0
    width: int = 1024
    height: int = 1024
    init_noise: np.ndarray | None = None  # (B, 128, H/16, W/16) or packed (B, N, 128)


@frozen(eq=False)
class GenerationResult:
    """The image plus what is needed to report and reproduce it."""

    pixels: np.ndarray  # (H, W, 3) uint8
    latents: np.ndarray  # final packed latents (1, N, 128), run dtype
    noise: np.ndarray  # initial packed latents (1, N, 128), run dtype
    settings: dict[str, Any]
    timings: dict[str, float]
    warnings: tuple[str, ...]
    peak_rss_bytes: int
    plan_peak_bytes: int


@define
class Flux2Pipeline:
    """Runs one checkpoint at one dtype on one backend; programs are cached per shape."""

    checkpoint: Flux2Checkpoint
    dtype: DType = DType.F32
    backend: str | None = None  # a dif backend name, None for the default, "interp" for the reference interpreter
    on_step: Callable[[int, int], None] | None = None
    on_stage: Callable[[str, float], None] | None = None
    plan_peak_bytes: int = field(init=False, default=0)  # largest plan's arena peak + parameters
    _runners: dict[tuple[Any, ...], Runner] = field(init=False, factory=dict)
    _tokenizer: Any = field(init=False, default=None)
    _backend: Any = field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.checkpoint.configs.transformer.guidance_embeds:
            raise CheckpointError(
                f"{self.checkpoint.root}: transformer has guidance_embeds=true (FLUX.2 [dev]); "
                "this pipeline runs [klein]"
            )

    # -- programs ------------------------------------------------------------------------------
    def _runner(self, key: tuple[Any, ...], build: Callable[[], Program], source: TensorSource, ignore: Any) -> Runner:
        runner = self._runners.get(key)
        if runner is None:
            program = build()
            weights = bind_weights(program, source, ignore=ignore)
            runner = self._runners[key] = self._prepare(program, weights)
        return runner

    @property
    def backend_name(self) -> str:
        """The backend that runs the programs ("interp" = the reference interpreter)."""
        if self.backend == "interp":
            return "interp"
        if self._backend is None:
            from dif.runtime import get_backend

            self._backend = get_backend(self.backend)
        return str(self._backend.name)

    def _prepare(self, program: Program, weights: Mapping[str, np.ndarray]) -> Runner:
        """The program ready to run: the reference interpreter for backend "interp", otherwise
        planned and prepared by `dif.runtime.prepare` on the named (or default) backend."""
        if self.backend == "interp":
            from dif.interp import interpret

            resolved = dict(weights)
            return lambda inputs: interpret(program, inputs, resolved)
        from dif.runtime import prepare

        _ = self.backend_name  # resolves the backend once (DIF_BACKEND / highest priority when None)
        executable, plan = prepare(program, weights, backend=self._backend)
        self.plan_peak_bytes = max(self.plan_peak_bytes, int(plan.peak_bytes + plan.param_bytes))
        return executable.run

    def prepare_all(self, width: int, height: int) -> None:
        """Build, bind and prepare the three programs for this size now (the CLI's load stage)."""
        h, w = check_size(width, height)
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
        )

    def _transformer_runner(self, n_img: int) -> Runner:
        cfg = self.checkpoint.configs.transformer
        return self._runner(
            ("transformer", n_img),
            lambda: build_transformer(cfg, batch=1, n_img=n_img, n_txt=MAX_LENGTH, dtype=self.dtype),
            self.checkpoint.transformer,
            (),
        )

    def _vae_runner(self, h: int, w: int) -> Runner:
        cfg = self.checkpoint.configs.vae
        return self._runner(
            ("vae", h, w),
            lambda: build_vae_decoder(cfg, batch=1, latent_h=2 * h, latent_w=2 * w, dtype=self.dtype, from_packed=True),
            self.checkpoint.vae,
            VAE_DECODER_UNUSED,
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
        return next(iter(out.values()))

    def denoise(
        self,
        noise: np.ndarray,
        text: np.ndarray,
        negative_text: np.ndarray | None,
        schedule: FlowMatchSchedule,
        guidance: float,
        h: int,
        w: int,
    ) -> np.ndarray:
        """Packed latents (1, h*w, 128) after the schedule; CFG when `negative_text` is given."""
        cfg = self.checkpoint.configs.transformer
        run = self._transformer_runner(h * w)
        cos, sin = flux2_rope_tables(MAX_LENGTH, h, w, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
        latents = noise.astype(self.dtype.np)
        for i, t in enumerate(schedule.timesteps):
            t_proj = flux2_timestep_proj([t], dtype=self.dtype, channels=cfg.timestep_guidance_channels)
            inputs = {
                "latents": latents,
                "text_features": text,
                "timestep_proj": t_proj,
                "rope_cos": cos,
                "rope_sin": sin,
            }
            velocity = next(iter(run(inputs).values()))
            if negative_text is not None:
                uncond = next(iter(run({**inputs, "text_features": negative_text}).values()))
                velocity = cfg_combine(velocity, uncond, guidance)
            latents = euler_step(latents, velocity, schedule.dt(i))
            if self.on_step is not None:
                self.on_step(i + 1, schedule.num_steps)
        return latents

    def decode(self, latents: np.ndarray, h: int, w: int) -> np.ndarray:
        """(H, W, 3) uint8 from packed latents, as the reference image processor rounds them."""
        image = next(iter(self._vae_runner(h, w)({"latents": latents}).values()))[0]
        if image.dtype != np.float32:  # the reference maps to [0, 1] in the run dtype before uint8
            half = np.float32(0.5)
            image = (image.astype(np.float32) * half).astype(image.dtype)
            image = (image.astype(np.float32) + half).astype(image.dtype)
            return to_uint8(image, value_range="0,1")
        return to_uint8(image)

    # -- the whole path ------------------------------------------------------------------------
    def resolve(self, req: GenerationRequest) -> tuple[int, float, bool, list[str]]:
        """(steps, guidance, use_cfg, warnings) with the distilled/base defaults and rules."""
        warnings: list[str] = []
        distilled = self.checkpoint.is_distilled
        steps = req.steps if req.steps is not None else (DISTILLED_STEPS if distilled else BASE_STEPS)
        if steps < 1:
            raise UsageError(f"steps must be at least 1, got {steps}")
        guidance = req.guidance if req.guidance is not None else (1.0 if distilled else BASE_GUIDANCE)
        if distilled and req.guidance is not None and req.guidance > 1.0:
            warnings.append(f"guidance {req.guidance} is ignored: this checkpoint is step-distilled (no CFG)")
        if distilled and req.negative_prompt:
            warnings.append("the negative prompt is ignored: this checkpoint is step-distilled (no CFG)")
        use_cfg = guidance > 1.0 and not distilled
        if not use_cfg and not distilled and req.negative_prompt:
            warnings.append(f"the negative prompt is ignored: CFG is off at guidance {guidance} (needs > 1)")
        return steps, guidance, use_cfg, warnings

    def initial_noise(self, req: GenerationRequest, h: int, w: int) -> np.ndarray:
        channels = self.checkpoint.configs.transformer.in_channels
        if req.init_noise is None:
            noise = gaussian_noise((1, channels, h, w), req.seed)
            return pack_noise(noise).astype(self.dtype.np)
        arr = np.asarray(req.init_noise)
        if arr.ndim == 3 and arr.shape[0] == channels and arr.shape[1:] == (h, w):
            arr = arr[None]
        if arr.shape == (1, channels, h, w):
            return pack_noise(arr.astype(np.float32)).astype(self.dtype.np)
        if arr.shape == (1, h * w, channels):
            return arr.astype(self.dtype.np)
        raise UsageError(
            f"initial noise has shape {list(arr.shape)}; for {w * 16}x{h * 16} it must be "
            f"[1, {channels}, {h}, {w}] (as diffusers' `latents`) or packed [1, {h * w}, {channels}]"
        )

    def generate(self, req: GenerationRequest) -> GenerationResult:
        h, w = check_size(req.width, req.height)
        steps, guidance, use_cfg, warnings = self.resolve(req)
        timings: dict[str, float] = {}

        def stage(name: str, start: float) -> None:
            timings[name] = time.perf_counter() - start
            if self.on_stage is not None:
                self.on_stage(name, timings[name])

        start = time.perf_counter()
        schedule = klein_schedule(h * w, steps, load_scheduler_settings(self.checkpoint.root))
        noise = self.initial_noise(req, h, w)  # cheap checks first, then the expensive load
        self.prepare_all(req.width, req.height)
        stage("load", start)
        start = time.perf_counter()
        text = self.encode(req.prompt)
        negative = self.encode(req.negative_prompt) if use_cfg else None
        stage("encode", start)
        start = time.perf_counter()
        latents = self.denoise(noise, text, negative, schedule, guidance, h, w)
        stage("denoise", start)
        start = time.perf_counter()
        pixels = self.decode(latents, h, w)
        stage("decode", start)
        settings = {
            "prompt": req.prompt,
            "negative_prompt": req.negative_prompt if use_cfg else "",
            "steps": steps,
            "guidance": guidance,
            "cfg": use_cfg,
            "seed": None if req.init_noise is not None else req.seed,
            "init_noise": req.init_noise is not None,
            "width": req.width,
            "height": req.height,
            "dtype": self.dtype.value,
            "mu": schedule.mu,
            "sampler": "flow-match euler",
            "model": self.checkpoint.name,
            "distilled": self.checkpoint.is_distilled,
            "layout": self.checkpoint.layout,
            "backend": self.backend_name,
        }
        return GenerationResult(
            pixels,
            latents,
            noise,
            settings,
            timings,
            tuple(warnings),
            peak_rss_bytes(),
            self.plan_peak_bytes,
        )


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    import sys

    return int(peak if sys.platform == "darwin" else peak * 1024)


def load_noise_file(path: str | Path) -> np.ndarray:
    """The initial-noise tensor of a safetensors file: its only tensor, or the one named
    `noise` / `latents`."""
    from dif.weights import open_safetensors

    source = open_safetensors(path)
    names = source.names()
    pick = names[0] if len(names) == 1 else next((n for n in ("noise", "latents") if n in names), None)
    if pick is None:
        raise UsageError(f"{path}: holds {len(names)} tensors; name the noise tensor 'noise' or 'latents'")
    return np.array(source[pick])
