"""Krea 2 text-to-image: prompt -> Qwen3-VL taps -> text fusion -> flow-match Euler loop -> VAE -> pixels.

Frontend stage, the whole product path. Four DiffIR programs (text encoder, text fusion + txt_in,
denoiser, VAE decoder) are built for the requested shape, bound to the checkpoint and prepared on
a backend once; text fusion runs once per prompt (it does not depend on the timestep), and the
sampling loop (`dif.kit.sampling`) runs on the host over `predictor`, the model's step:
  sigmas = linspace(1, 1/n, n), exponential shift with mu = 1.15 (Turbo, `is_distilled`) or the
           resolution-dependent line through (256, 0.5) and (6400, 1.15) (Raw)
  per step: v = denoiser(latents, t) [CFG when g > 0: v = v_c + g (v_c - v_u), negative prompt ""]
            (`dif.sched.cfg_combine(..., base="cond")`)
            latents = latents + (sigma_next - sigma) * v, stored in the run dtype
The token size (pixels per token) comes from the VAE and model_index configs. Roundings follow
diffusers' Krea2Pipeline, so an fp32 run from the same initial noise reproduces
its latents; `init_noise` supplies that noise, seeds use numpy's PCG64 (`dif.noise`).

The reference pads every prompt to `max_sequence_length` text tokens and masks the padding out of every
attention; the denoiser here gets the prompts' attended tokens only, in rows rounded up to `TEXT_ROWS_STEP`
(`Krea2Pipeline.denoiser_text_rows`). No value changes: a masked key adds nothing to any softmax, every other
op of the denoiser is per token, and the text tokens' rotary positions are all the origin. At 1024² a prompt
of 100 tokens makes 4,224 joint tokens instead of 4,608.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Mapping
from typing import Any, ClassVar, Literal

import numpy as np
from attrs import define, field, frozen

from dif.checkpoint import native_size
from dif.dtypes import DType
from dif.errors import DifWarning, UsageError
from dif.image_pipeline import ImageRequest, TextToImagePipeline
from dif.ir.program import Program
from dif.kit.admission import admit_image
from dif.kit.finite import require_finite, require_finite_probe
from dif.kit.sampling import Predict, StepCallback, step_invariant
from dif.noise import initial_latents
from dif.program_cache import ProgramCache
from dif.runtime import Runner
from dif.sched import FlowMatchSchedule
from dif.text import TextTokenizer
from dif_frontend_krea2.config import TURBO_MU, Krea2Configs
from dif_frontend_krea2.model import (
    attention_mask,
    build_denoiser,
    build_text_fusion,
    rope_tables,
    timestep_proj_from_timesteps,
)
from dif_frontend_krea2.plugin import INFO
from dif_frontend_krea2.text_encoder import build_text_encoder, text_rope_tables
from dif_frontend_krea2.tokenize import MAX_SEQUENCE_LENGTH, PromptTokens, encode_prompt
from dif_frontend_krea2.vae import build_vae_decoder
from dif_frontend_krea2.weights import Krea2Checkpoint, bind_denoiser, bind_text_encoder, bind_text_fusion, bind_vae

TEXT_ROWS_STEP = 64
"""The denoiser's text rows are the attended tokens rounded up to a multiple of this (and at most the padded
length): prompts of similar length share one program."""

# -- shape, schedule and latent layout ------------------------------------------------------------


def round_size(width: int, height: int, pixels_per_token: int) -> tuple[int, int, list[str]]:
    """(width, height) rounded up to multiples of the token size, as the reference does, with a
    warning each."""
    if width <= 0 or height <= 0:
        raise UsageError(f"image size {width}x{height} must be positive")
    ppt = pixels_per_token
    out, warnings = [], []
    for name, value in (("width", width), ("height", height)):
        rounded = -(-value // ppt) * ppt
        if rounded != value:
            warnings.append(
                f"{name} {value} rounded up to {rounded} (this checkpoint works on {ppt}x{ppt}-pixel tokens)"
            )
        out.append(rounded)
    return out[0], out[1], warnings


def default_steps_guidance(configs: Krea2Configs) -> tuple[int, float]:
    """(steps, guidance) defaults of the checkpoint's variant (`plugin.INFO`: Turbo 8 / 0.0, Raw 28 / 4.5)."""
    kind = configs.pipeline.variant
    return INFO.default("steps", kind), INFO.default("guidance", kind)


def krea2_schedule(configs: Krea2Configs, image_len: int, steps: int) -> FlowMatchSchedule:
    """Sigmas for `steps` Euler steps at `image_len` tokens: Turbo shifts with the fixed mu = 1.15,
    Raw with the scheduler config's resolution-dependent mu (both only under dynamic shifting, as
    the scheduler ignores mu otherwise and applies its static `shift`)."""
    sched = configs.scheduler
    return sched.schedule(steps, mu=TURBO_MU if configs.pipeline.is_distilled else sched.mu_for(image_len))


def pack_latents(latents: np.ndarray) -> np.ndarray:
    """(B, C, h, w) -> (B, h/2 * w/2, 4C): 2x2 patches row-major, channel c*4 + 2*dy + dx."""
    b, c, h, w = latents.shape
    x = latents.reshape(b, c, h // 2, 2, w // 2, 2).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(x.reshape(b, (h // 2) * (w // 2), c * 4))


def unpack_latents(packed: np.ndarray, grid_h: int, grid_w: int) -> np.ndarray:
    """(B, grid_h * grid_w, 4C) -> (B, C, 2 grid_h, 2 grid_w), the inverse of `pack_latents`."""
    b, _, cp = packed.shape
    x = packed.reshape(b, grid_h, grid_w, cp // 4, 2, 2).transpose(0, 3, 1, 4, 2, 5)
    return np.ascontiguousarray(x.reshape(b, cp // 4, grid_h * 2, grid_w * 2))


def denormalize(latents: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """`latents / (1 / std) + mean` per channel of (B, C, h, w), each operation rounded to the
    latents' dtype as the reference does (it builds 1/std in that dtype first)."""
    dt = latents.dtype
    shape = (1, len(mean), 1, 1)
    inv_std = (np.float32(1.0) / np.asarray(std, np.float32).astype(dt).astype(np.float32)).astype(dt)
    m = np.asarray(mean, np.float32).astype(dt).reshape(shape)
    x = (latents.astype(np.float32) / inv_std.reshape(shape).astype(np.float32)).astype(dt)
    return (x.astype(np.float32) + m.astype(np.float32)).astype(dt)


# -- the pipeline ---------------------------------------------------------------------------------


@frozen
class GenerationRequest(ImageRequest):
    """One Krea 2 text-to-image job. None settings take the checkpoint's defaults (see `resolve`;
    the values: `plugin.INFO`), CFG running whenever guidance > 0. `init_noise`: (1, 16, H/8, W/8)
    or packed (1, N, 64) for the 8x VAE."""


@frozen(eq=False)
class EncodedPrompt:
    """Text conditioning for the denoiser: embeds (1, L, hidden) in the run dtype, mask (1, L) bool."""

    embeds: np.ndarray
    mask: np.ndarray
    tokens: PromptTokens

    @property
    def attended(self) -> int:
        """The tokens the mask keeps: the prompt's and the template's suffix."""
        return int(self.mask.sum())


def attended_rows(prompt: EncodedPrompt, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(embeds (1, rows, hidden), mask (1, rows)): the attended tokens of `prompt` first, in order, then masked
    zero rows. The denoiser's values do not change: the masked rows are keys no softmax weighs, and every other
    op is per token, the text tokens' rotary positions all the origin."""
    keep = np.flatnonzero(prompt.mask[0])
    if keep.size > rows:
        raise UsageError(f"the prompt attends {keep.size} text tokens; the denoiser was built for {rows}")
    embeds = np.zeros((1, rows, prompt.embeds.shape[2]), prompt.embeds.dtype)
    embeds[:, : keep.size] = prompt.embeds[:, keep]
    return embeds, (np.arange(rows) < keep.size)[None]


@define
class Krea2Pipeline(TextToImagePipeline):
    """Runs one checkpoint at one dtype on one backend; programs are cached per shape."""

    cfg_base: ClassVar[Literal["uncond", "cond"]] = "cond"  # v = v_c + g (v_c - v_u)
    checkpoint: Krea2Checkpoint
    dtype: DType = DType.F32
    backend: str | None = None  # a dif backend name, None for the default, "interp" for the reference interpreter
    max_sequence_length: int = MAX_SEQUENCE_LENGTH
    text_rows_step: int = TEXT_ROWS_STEP  # 0: the denoiser takes the padded `max_sequence_length` rows
    on_step: StepCallback | None = None
    on_stage: Callable[[str, float], None] | None = None
    vram_budget: int | None = None  # device bytes the whole pipeline may hold (`ProgramCache`)
    _programs: ProgramCache = field(init=False)
    _tokenizer: TextTokenizer | None = field(init=False, default=None)
    # the denoiser's RoPE tables by (text rows, token grid), frozen: made once, staged to the device once
    # (`step_invariant`)
    _rope: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = field(init=False, factory=dict)
    _text_rows: int = field(init=False, default=0)  # the denoiser's text rows so far (`denoiser_text_rows`)

    def __attrs_post_init__(self) -> None:
        self._programs = ProgramCache(self.backend, vram_budget=self.vram_budget)

    @property
    def configs(self) -> Krea2Configs:
        return self.checkpoint.configs

    @property
    def pixels_per_token(self) -> int:
        return self.configs.pixels_per_token

    @property
    def native_size(self) -> int:
        return native_size(self.checkpoint.root, multiple=self.pixels_per_token)

    # -- programs ------------------------------------------------------------------------------
    def _text_encoder_runner(self, seq_len: int, drop_prefix: int) -> Runner:
        cfg, taps = self.configs.text_encoder, self.configs.pipeline.text_encoder_select_layers

        def build() -> tuple[Program, Mapping[str, np.ndarray]]:
            prog = build_text_encoder(cfg, seq_len=seq_len, taps=taps, drop_prefix=drop_prefix, dtype=self.dtype)
            return prog, bind_text_encoder(prog, self.checkpoint.text_encoder, self.checkpoint.text_prefix)

        return self._programs.get(("text_encoder", seq_len, drop_prefix), build, "encode")

    def _transformer_runner(
        self, key: Hashable, build: Callable[[], Program], bind: Callable[[Program, Any], Any], stage: str
    ) -> Runner:
        """A program on the transformer's weights: with the checkpoint's LoRAs (side-GEMM slots fed with
        the current adapters when unmerged; the mode decision recorded in the program either way)."""
        lora = self.checkpoint.loras

        def build_and_bind() -> tuple[Program, Mapping[str, np.ndarray]]:
            prog = build() if lora is None else lora.build(key, build)
            return prog, bind(prog, self.checkpoint.transformer)

        # its linears stored as fp8-e4m3 run in fp8 where the backend executes it (`dif.weights.fp8.choose_fp8`)
        run = self._programs.get(key, build_and_bind, stage, keep_fp8=True)
        return run if lora is None else lora.feed(key, run, self.dtype)

    def _fusion_runner(self) -> Runner:
        def build() -> Program:
            return build_text_fusion(self.configs.transformer, text_len=self.max_sequence_length, dtype=self.dtype)

        return self._transformer_runner(("text_fusion",), build, bind_text_fusion, "encode")

    def _denoiser_runner(self, image_len: int, text_rows: int, batch: int = 1) -> Runner:
        """The denoiser over `text_rows` text and `image_len` image tokens for `batch` images (one program,
        batch axis `batch`)."""

        def build() -> Program:
            return build_denoiser(
                self.configs.transformer, image_len=image_len, text_len=text_rows, batch=batch, dtype=self.dtype
            )

        key = ("denoiser", image_len, text_rows) if batch == 1 else ("denoiser", image_len, text_rows, batch)
        return self._transformer_runner(key, build, bind_denoiser, "denoise")

    def denoiser_text_rows(self, attended: int) -> int:
        """The denoiser's text rows for a prompt of `attended` tokens: rounded up to `text_rows_step`, at most
        `max_sequence_length`, and never fewer than an earlier prompt of this pipeline needed, so the prompts of
        a run (and of later runs no longer) share one program."""
        step = self.text_rows_step
        rows = self.max_sequence_length if step <= 0 else min(self.max_sequence_length, -(-attended // step) * step)
        if rows > self._text_rows:  # the denoisers of fewer rows will not run again: their device memory goes
            registered = self._programs.keys()
            for key in registered:
                if isinstance(key, tuple) and key[:1] == ("denoiser",) and key[2] == self._text_rows:
                    self._programs.discard(key)
            self._text_rows = rows
        return self._text_rows

    def _vae_runner(self, grid_h: int, grid_w: int, *, pixels: bool = True) -> Runner:
        """The decoder of a grid; with `pixels` it ends in the picture's 8-bit pixels and their finiteness
        probe (`dif.layers.pixels`: made on the device, as `to_uint8` would on the host)."""
        cfg, p = self.configs.vae, self.configs.pipeline.patch_size

        def build() -> tuple[Program, Mapping[str, np.ndarray]]:
            prog = build_vae_decoder(cfg, latent_h=p * grid_h, latent_w=p * grid_w, dtype=self.dtype, pixels=pixels)
            return prog, bind_vae(prog, self.checkpoint.vae)

        key = ("vae", grid_h, grid_w) if pixels else ("vae", grid_h, grid_w, "image")
        return self._programs.get(key, build, "decode")

    def prepare_all(self, width: int, height: int, req: ImageRequest | None = None) -> None:
        """Build, bind and plan every program for this (already rounded) size and `req`'s batch now; the
        denoiser's text rows are those `req`'s prompts attend (the negative one's too under CFG), without a
        request the padded length (any prompt then runs on that program)."""
        gh, gw = height // self.pixels_per_token, width // self.pixels_per_token
        prompts = [""] if req is None else [req.prompt, *([req.negative_prompt] if self._cfg(req) else [])]
        with warnings.catch_warnings():  # a prompt cut to the encoder's room is told once, when it is encoded
            warnings.simplefilter("ignore", DifWarning)
            tokens = [encode_prompt(self.tokenizer, p, max_sequence_length=self.max_sequence_length) for p in prompts]
        self._text_encoder_runner(tokens[0].seq_len, tokens[0].drop_prefix)
        self._fusion_runner()
        attended = self.max_sequence_length if req is None else max(int(t.text_mask.sum()) for t in tokens)
        rows = self.denoiser_text_rows(attended)
        self._denoiser_runner(gh * gw, rows, 1 if req is None else req.batch)
        self._vae_runner(gh, gw)

    def _cfg(self, req: ImageRequest) -> bool:
        """Whether `req` runs CFG: guidance > 0, the model's default where unset (as `resolve` decides)."""
        guidance = req.guidance if req.guidance is not None else default_steps_guidance(self.configs)[1]
        return guidance > 0

    # -- stages --------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None:
            self._tokenizer = TextTokenizer.from_folder(self.checkpoint.tokenizer_dir)
        return self._tokenizer

    def text_features(self, prompt: str) -> tuple[np.ndarray, PromptTokens]:
        """Tapped hidden states (1, L, num_taps, hidden) in the run dtype, and the prompt's tokens."""
        tokens = encode_prompt(self.tokenizer, prompt, max_sequence_length=self.max_sequence_length)
        cos, sin = text_rope_tables(self.configs.text_encoder, tokens.positions, dtype=self.dtype)
        run = self._text_encoder_runner(tokens.seq_len, tokens.drop_prefix)
        out = run({"input_ids": tokens.ids, "attention_mask": tokens.mask, "rope_cos": cos, "rope_sin": sin})
        return require_finite("text features", next(iter(out.values()))), tokens

    def encode(self, prompt: str) -> EncodedPrompt:
        """Text features of `prompt` fused and projected once (timestep-independent)."""
        feats, tokens = self.text_features(prompt)
        out = self._fusion_runner()({"text_hidden_states": feats, "text_mask": tokens.text_mask})
        embeds = require_finite("fused text features", next(iter(out.values())))
        return EncodedPrompt(embeds, tokens.text_mask, tokens)

    def predictor(self, grid_h: int, grid_w: int, images: Any = None) -> Predict:
        """The denoiser at grid_h x grid_w tokens: (latents (B, N, 64), t, `EncodedPrompt`) -> velocity
        (B, N, 64); the prompt's embeds and mask are repeated over the batch."""
        cfg = self.configs.transformer
        n_img = grid_h * grid_w
        per_prompt: dict[tuple[int, int, int], dict[str, np.ndarray]] = {}  # per prompt, batch and text rows

        def predict(latents: np.ndarray, t: float, prompt: EncodedPrompt) -> np.ndarray:
            batch = latents.shape[0]
            # the rows the prompts so far need: a later prompt that needs more moves them all to its program
            rows = self.denoiser_text_rows(prompt.attended)
            key = (id(prompt), batch, rows)
            if key not in per_prompt:  # the same objects every step (`step_invariant`)
                embeds, mask = attended_rows(prompt, rows)
                per_prompt[key] = {
                    "text_embeds": step_invariant(np.repeat(embeds, batch, axis=0)),
                    "attention_mask": step_invariant(np.repeat(attention_mask(mask, n_img), batch, 0)),
                }
            if (rows, grid_h, grid_w) not in self._rope:
                tables = rope_tables(cfg, rows, grid_h, grid_w)
                self._rope[rows, grid_h, grid_w] = tuple(map(step_invariant, tables))  # type: ignore[assignment]
            cos, sin = self._rope[rows, grid_h, grid_w]
            t_proj = timestep_proj_from_timesteps([t] * batch, dtype=self.dtype, dim=cfg.timestep_embed_dim)
            inputs = {"latents": latents, "timestep_proj": t_proj, "rope_cos": cos, "rope_sin": sin}
            run = self._denoiser_runner(n_img, rows, batch)
            return next(iter(run({**inputs, **per_prompt[key]}).values()))

        return predict

    def decode_image(self, latents: np.ndarray, grid_h: int, grid_w: int) -> np.ndarray:
        """(1, 3, H, W) in [-1, 1] from packed latents (denormalized, then the VAE decoder)."""
        return next(iter(self._decode(latents, grid_h, grid_w, pixels=False).values()))

    def _decode(self, latents: np.ndarray, grid_h: int, grid_w: int, *, pixels: bool) -> dict[str, np.ndarray]:
        vae = self.configs.vae
        z = denormalize(unpack_latents(latents, grid_h, grid_w), vae.latents_mean, vae.latents_std)
        return self._vae_runner(grid_h, grid_w, pixels=pixels)({"latents": z})

    def decode(self, latents: np.ndarray, grid_h: int, grid_w: int) -> np.ndarray:
        """(H, W, 3) uint8, rounded as the reference image processor does (`to_uint8`), on the decoder's
        backend; a non-finite picture is refused as the host check would."""
        pixels, probe = self._decode(latents, grid_h, grid_w, pixels=True).values()
        require_finite_probe("decoded image", probe)
        return pixels

    # -- the whole path ------------------------------------------------------------------------
    def resolve(self, req: GenerationRequest) -> tuple[int, float, bool, list[str]]:
        """(steps, guidance, use_cfg, warnings) with the Turbo/Raw defaults and the reference rule
        (CFG whenever guidance > 0); the size rounding's warnings first."""
        self.check_model_inputs(req)
        warnings = self.fit_size(*self.size(req))[2]
        default_steps, default_guidance = default_steps_guidance(self.configs)
        steps = req.steps if req.steps is not None else default_steps
        if steps < 1:
            raise UsageError(f"steps must be at least 1, got {steps}")
        guidance = req.guidance if req.guidance is not None else default_guidance
        if guidance < 0:
            raise UsageError(f"guidance must be >= 0 (0 switches CFG off), got {guidance}")
        use_cfg = guidance > 0
        if self.checkpoint.is_distilled and use_cfg:
            warnings.append(f"guidance {guidance} runs CFG on Turbo, which is distilled for guidance 0")
        if not use_cfg and req.negative_prompt:
            warnings.append("the negative prompt is ignored: CFG is off at guidance 0")
        width, height, _ = self.fit_size(*self.size(req))
        channels = self.configs.pipeline.patch_size**2 * self.configs.vae.z_dim
        admit_image(
            width, height, pixels_per_token=self.pixels_per_token, channels=channels, steps=steps, cfg=use_cfg,
            dtype=self.dtype, schedule=self.schedule, guidance=guidance, batch=req.batch,
        )  # fmt: skip
        return steps, guidance, use_cfg, warnings

    def initial_noise(self, req: GenerationRequest, grid_h: int, grid_w: int) -> np.ndarray:
        """Packed initial latents (B, N, 64) in the run dtype: image i from seed + i, or `init_noise`
        (B rows, unpacked or packed)."""
        z, p, b = self.configs.vae.z_dim, self.configs.pipeline.patch_size, req.batch
        what = f"{grid_w * self.pixels_per_token}x{grid_h * self.pixels_per_token}" + (
            f" x {b} images" if b > 1 else ""
        )

        def draw(init: np.ndarray | None, seed: int, rows: int) -> np.ndarray:
            return initial_latents(
                init, seed, unpacked=(rows, z, p * grid_h, p * grid_w), packed=(rows, grid_h * grid_w, p * p * z),
                pack=pack_latents, dtype=self.dtype, what=what, rng=req.rng,
            )  # fmt: skip

        if req.init_noise is not None or b == 1:
            return draw(req.init_noise, req.seed, b)
        return np.concatenate([draw(None, req.seed + i, 1) for i in range(b)], axis=0)

    def fit_size(self, width: int, height: int) -> tuple[int, int, list[str]]:
        """Rounded up to the token grid, with a warning each (`round_size`)."""
        return round_size(width, height, self.pixels_per_token)

    def schedule(self, image_tokens: int, steps: int) -> FlowMatchSchedule:
        return krea2_schedule(self.configs, image_tokens, steps)

    def run_keys(self) -> dict[str, Any]:
        ck = self.checkpoint
        keys: dict[str, Any] = {"model": ck.name, "variant": ck.variant, "distilled": ck.is_distilled}
        if ck.loras is not None and (mode := ck.loras.current()) is not None:
            keys["lora"] = mode.to_dict()  # merged or unmerged, why, and the adapters now (`dif.lora.mode`)
        return keys
