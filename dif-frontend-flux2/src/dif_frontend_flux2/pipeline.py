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
Editing (docs/editing.md): up to 4 reference images, VAE-encoded (a VAE encoder program per image size)
and appended to the denoiser's sequence at RoPE time 10, 20, ... (Flux2KleinPipeline), or with the K/V
cache reduced to their keys/values, computed once by `build_reference_kv` (Flux2KleinKVPipeline);
img2img and inpainting as Flux2KleinInpaintPipeline (their pixels prepared in `image_inputs`); a batch of B
is one denoiser program of batch B. `--vae-tiling` decodes tile by tile as diffusers' `enable_tiling()`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
from attrs import define, field, frozen

from dif.checkpoint import native_size
from dif.dtypes import DType
from dif.errors import CheckpointError, PlanError, UsageError
from dif.image_pipeline import ImageConditioning, ImageRequest, TextToImagePipeline
from dif.ir.program import Program
from dif.kit.admission import admit_image
from dif.kit.finite import require_finite, require_finite_probe
from dif.kit.sampling import Predict, StepCallback, step_invariant
from dif.kit.scheduler import FlowMatchConfig, load_scheduler_config
from dif.kit.tiling import TileLayout, decode_tiled
from dif.media import to_uint8
from dif.noise import initial_latents
from dif.program_cache import ProgramCache
from dif.runtime import Runner
from dif.sched import FlowMatchSchedule
from dif.weights import TensorSource, bind_weights
from dif_frontend_flux2.image_inputs import (
    MAX_REFERENCE_IMAGES,
    init_pixels,
    mask_tokens,
    reference_pixels,
    reference_size,
)
from dif_frontend_flux2.model import (
    build_reference_kv,
    build_transformer,
    flux2_reference_rope_tables,
    flux2_rope_tables,
    flux2_timestep_proj,
    reference_kv_names,
    reference_kv_unused,
)
from dif_frontend_flux2.plugin import INFO
from dif_frontend_flux2.text_encoder import KLEIN_TAPS, build_text_encoder, qwen3_rope_tables
from dif_frontend_flux2.tokenize import klein_prompt_text, load_tokenizer, tokenize_prompts
from dif_frontend_flux2.vae import build_latent_decode_prep, build_vae_decoder, build_vae_encoder
from dif_frontend_flux2.weights import VAE_DECODER_UNUSED, Flux2Checkpoint, text_encoder_unused

VAE_ENCODER_UNUSED = (r"decoder\..*", r"post_quant_conv\..*", r"bn\.num_batches_tracked")

KLEIN_SCHEDULER = FlowMatchConfig(shift=3.0, use_dynamic_shifting=True)
"""klein's scheduler when a checkpoint ships no scheduler/scheduler_config.json (its published one)."""


VAE_TILING = ("auto", "on", "off")
"""When the VAE decodes tile by tile (`Flux2Pipeline.vae_tiling`, --vae-tiling)."""


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


@frozen(eq=False)
class ReferenceTokens:
    """The packed, normalized VAE latents of a run's reference images, (1, sum h_i*w_i, 128) in the run
    dtype, and each image's token grid (h_i, w_i) in order (their RoPE time coordinates 10, 20, ...).
    `kv`: with the reference K/V cache, their keys and values in every block (`reference_kv_names` ->
    (1, n_ref, heads, head_dim)), computed once; the tokens then stay out of the denoiser's sequence."""

    tokens: np.ndarray
    shapes: tuple[tuple[int, int], ...]
    kv: dict[str, np.ndarray] | None = None


@frozen
class GenerationRequest(ImageRequest):
    """One FLUX.2 text-to-image job. None settings take the checkpoint's defaults (see `resolve`;
    the values: `plugin.INFO`). `init_noise`: (B, 128, H/16, W/16) or packed (B, N, 128) at 16
    pixels per token."""


@define
class Flux2Pipeline(TextToImagePipeline):
    """Runs one checkpoint at one dtype on one backend; programs are cached per shape."""

    max_reference_images = MAX_REFERENCE_IMAGES
    takes_init_image = True

    checkpoint: Flux2Checkpoint
    dtype: DType = DType.F32
    backend: str | None = None  # a dif backend name, None for the default, "interp" for the reference interpreter
    on_step: StepCallback | None = None
    on_stage: Callable[[str, float], None] | None = None
    vram_budget: int | None = None  # device bytes the whole pipeline may hold (`ProgramCache`)
    vae_tiling: str = "auto"  # VAE_TILING: decode tile by tile "on", never "off", "auto" when the whole won't fit
    _programs: ProgramCache = field(init=False)
    _tiles: dict[tuple[int, int], TileLayout | None] = field(init=False, factory=dict)  # by token grid
    _tokenizer: Any = field(init=False, default=None)
    # the denoiser's RoPE tables by token grid and reference shapes, frozen: computing them took 11 ms of every
    # image's first step at 1024^2, and the same arrays are staged to the device once (`step_invariant`)
    _rope: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.checkpoint.configs.transformer.guidance_embeds:
            raise CheckpointError(
                f"{self.checkpoint.root}: transformer has guidance_embeds=true (FLUX.2 [dev]); "
                "this pipeline runs [klein]"
            )
        if self.vae_tiling not in VAE_TILING:
            raise UsageError(f"vae tiling '{self.vae_tiling}' is not one of {', '.join(VAE_TILING)}")
        self._programs = ProgramCache(self.backend, vram_budget=self.vram_budget)

    @property
    def pixels_per_token(self) -> int:
        return self.checkpoint.configs.pixels_per_token

    @property
    def text_length(self) -> int:
        """Text rows per prompt, pads included: the checkpoint's `max_sequence_length` (512 unless its
        model_index.json says otherwise)."""
        return self.checkpoint.configs.pipeline.max_sequence_length

    @property
    def native_size(self) -> int:
        return native_size(self.checkpoint.root, multiple=self.pixels_per_token)

    # -- programs ------------------------------------------------------------------------------
    def _runner(
        self,
        key: Hashable,
        build: Callable[[], Program],
        source: TensorSource,
        ignore: Any,
        stage: str,
        group: str | None = None,
    ) -> Runner:
        lora = self.checkpoint.loras if source is self.checkpoint.transformer else None
        # the transformer's linears stored as fp8-e4m3 run in fp8 where the backend executes it (`choose_fp8`)
        keep_fp8 = source is self.checkpoint.transformer

        def build_and_bind() -> tuple[Program, Mapping[str, np.ndarray]]:
            # LoRA: side-GEMM slots when unmerged, the mode decision recorded in the program either way
            program = build() if lora is None else lora.build(key, build)
            return program, bind_weights(program, source, ignore=ignore)

        run = self._programs.get(key, build_and_bind, stage, group, keep_fp8=keep_fp8)
        return run if lora is None else lora.feed(key, run, self.dtype)

    def size(self, req: ImageRequest, /) -> tuple[int, int]:
        """(width, height): an init image's (fitted) size; else the request's, each side left out taking the
        first reference image's (fitted) size, then the native size (as the reference pipelines choose)."""
        ppt = self.pixels_per_token
        if req.init_image is not None:
            return reference_size(req.init_image, ppt)
        if req.ref_images:
            w, h = reference_size(req.ref_images[0], ppt)
            return req.width or w, req.height or h
        return super().size(req)

    def prepare_all(self, width: int, height: int, req: ImageRequest | None = None) -> None:
        """Build, bind and plan the programs for this size (and `req`'s batch and images) now (the CLI's
        load stage): text encoder, denoiser, VAE decoder, and a VAE encoder per image size."""
        h, w = check_size(width, height, self.pixels_per_token)
        self._text_runner()
        batch = 1 if req is None else req.batch
        ref_tokens = 0
        if req is not None:
            for hw in self._image_sizes(req):
                self._vae_encoder_runner(*hw)
            ref_tokens = sum(ih * iw for ih, iw in self._ref_grids(req))
        if req is not None and self.uses_kv_cache(req):
            self._reference_kv_runner(ref_tokens)
            self._transformer_runner(h * w, batch, n_ref_cached=ref_tokens)
        else:
            self._transformer_runner(h * w + ref_tokens, batch)
        self._prepare_decode(h, w)

    def _prepare_decode(self, h: int, w: int) -> None:
        """The decode programs of an h x w token grid: the whole-image decoder, or (`vae_tiling` "on", or
        "auto" when the whole decode does not fit the budget resident) the latent unpacking and one
        decoder per tile shape of the reference's tiled decode (`dif.kit.tiling`)."""
        cfg = self.checkpoint.configs.vae
        ph, pw = cfg.patch_size
        layout = TileLayout(cfg.tile_latent, cfg.scale_factor)
        can_tile = layout.needed(ph * h, pw * w)
        tiled = self.vae_tiling == "on" and can_tile
        if not tiled:
            try:
                self._vae_runner(h, w)
            except PlanError:
                if self.vae_tiling == "off" or not can_tile:
                    raise
                tiled = True
            else:  # "auto": whole when it fits resident, not by streaming the decoder's weights at every decode
                if self.vae_tiling == "auto" and can_tile and not self._programs.fits_resident(("vae", h, w)):
                    self._programs.discard(("vae", h, w))
                    tiled = True
        self._tiles[(h, w)] = layout if tiled else None
        if tiled:
            self._latent_runner(h, w)
            for th, tw in layout.shapes(ph * h, pw * w):
                self._vae_tile_runner(th, tw)

    def uses_kv_cache(self, req: ImageRequest) -> bool:
        """Whether `req` runs with the reference K/V cache (klein KV's form: the reference tokens attend
        only to each other at timestep 0, their keys/values computed once): `req.kv_cache`, by default on
        for a Flux2KleinKVPipeline checkpoint; never without reference images."""
        if not req.ref_images:
            return False
        return self.checkpoint.configs.pipeline.kv_cache if req.kv_cache is None else bool(req.kv_cache)

    def _image_sizes(self, req: ImageRequest) -> list[tuple[int, int]]:
        """(height, width) in pixels of every image the request encodes, in sequence order: the init image
        first (the inpainting pipeline conditions on it), then the reference images."""
        ppt = self.pixels_per_token
        images = ([req.init_image] if req.init_image is not None else []) + list(req.ref_images)
        return [reference_size(r, ppt)[::-1] for r in images]

    def _ref_grids(self, req: ImageRequest) -> list[tuple[int, int]]:
        """Token grids (h, w) of the conditioning images, in sequence order (`_image_sizes`)."""
        ppt = self.pixels_per_token
        return [(ph // ppt, pw // ppt) for ph, pw in self._image_sizes(req)]

    def _text_runner(self) -> Runner:
        cfg = self.checkpoint.configs.text_encoder
        taps = KLEIN_TAPS
        if max(taps) > cfg.num_hidden_layers:
            raise CheckpointError(f"text encoder has {cfg.num_hidden_layers} layers; klein taps layers {taps}")
        return self._runner(
            ("text",),
            lambda: build_text_encoder(cfg, batch=1, seq_len=self.text_length, taps=taps, dtype=self.dtype),
            self.checkpoint.text_encoder,
            text_encoder_unused(max(taps), cfg.num_hidden_layers),
            "encode",
        )

    def _transformer_runner(self, n_img: int, batch: int = 1, n_ref_cached: int = 0) -> Runner:
        """The denoiser over `n_img` image tokens (the latents, then any reference tokens) for `batch` images;
        with `n_ref_cached`, also attending to that many reference tokens' cached keys/values."""
        cfg = self.checkpoint.configs.transformer
        key: tuple[Any, ...] = ("transformer", n_img) if batch == 1 else ("transformer", n_img, batch)
        return self._runner(
            key + (("kv", n_ref_cached),) if n_ref_cached else key,
            lambda: build_transformer(
                cfg, batch=batch, n_img=n_img, n_txt=self.text_length, dtype=self.dtype, n_ref_cached=n_ref_cached
            ),
            self.checkpoint.transformer,
            (),
            "denoise",
        )

    def _vae_runner(self, h: int, w: int, *, pixels: bool = True) -> Runner:
        """The whole-image decoder of an h x w token grid; with `pixels` it ends in the picture's 8-bit pixels
        and their finiteness probe (`dif.layers.pixels`: made on the device, as `to_uint8` would on the host)."""
        cfg = self.checkpoint.configs.vae
        ph, pw = cfg.patch_size  # one token is a patch of latent pixels
        return self._runner(
            ("vae", h, w) if pixels else ("vae", h, w, "image"),
            lambda: build_vae_decoder(
                cfg, batch=1, latent_h=ph * h, latent_w=pw * w, dtype=self.dtype, from_packed=True, pixels=pixels
            ),
            self.checkpoint.vae,
            VAE_DECODER_UNUSED,
            "decode",
        )

    def _latent_runner(self, h: int, w: int) -> Runner:
        """Packed latents of an h x w token grid -> the VAE latent (de-normalized, unpatchified)."""
        cfg = self.checkpoint.configs.vae
        ph, pw = cfg.patch_size
        return self._runner(
            ("vae_latent", h, w),
            lambda: build_latent_decode_prep(cfg, batch=1, latent_h=ph * h, latent_w=pw * w, dtype=self.dtype),
            self.checkpoint.vae,
            lambda name: name not in ("bn.running_mean", "bn.running_var"),
            "decode",
        )

    def _vae_tile_runner(self, th: int, tw: int) -> Runner:
        """The decoder of one th x tw latent tile."""
        cfg = self.checkpoint.configs.vae
        return self._runner(
            ("vae_tile", th, tw),
            lambda: build_vae_decoder(cfg, batch=1, latent_h=th, latent_w=tw, dtype=self.dtype),
            self.checkpoint.vae,
            VAE_DECODER_UNUSED + (r"bn\..*",),
            "decode",
            group="vae tiles",  # one tile shape after another: the decode holds one tile decoder at a time
        )

    def _reference_kv_runner(self, n_ref: int) -> Runner:
        """The reference stream's keys/values in every block for `n_ref` reference tokens (`build_reference_kv`)."""
        cfg = self.checkpoint.configs.transformer
        return self._runner(
            ("reference_kv", n_ref),
            lambda: build_reference_kv(cfg, n_ref=n_ref, dtype=self.dtype),
            self.checkpoint.transformer,
            reference_kv_unused(cfg),
            "encode",
        )

    def reference_kv(self, refs: ReferenceTokens) -> dict[str, np.ndarray]:
        """Keys/values of `refs` in every block (`reference_kv_names` -> (1, n_ref, heads, head_dim))."""
        cfg = self.checkpoint.configs.transformer
        cos, sin = flux2_reference_rope_tables(refs.shapes, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
        t0 = flux2_timestep_proj([0.0], dtype=self.dtype, channels=cfg.timestep_guidance_channels)
        run = self._reference_kv_runner(refs.tokens.shape[1])
        out = run({"ref_latents": refs.tokens, "timestep_proj": t0, "rope_cos": cos, "rope_sin": sin})
        values = [require_finite("reference keys/values", v) for v in out.values()]
        return dict(zip(reference_kv_names(cfg), values, strict=True))

    def _vae_encoder_runner(self, height: int, width: int) -> Runner:
        """The VAE encoder of one `height` x `width`-pixel image to packed, normalized tokens."""
        cfg = self.checkpoint.configs.vae
        return self._runner(
            ("vae_encoder", height, width),
            lambda: build_vae_encoder(cfg, batch=1, height=height, width=width, dtype=self.dtype, to_packed=True),
            self.checkpoint.vae,
            VAE_ENCODER_UNUSED,
            "encode",
        )

    def encode_image(self, pixels: np.ndarray) -> np.ndarray:
        """(1, 3, H, W) pixels in [-1, 1] -> packed normalized latents (1, (H/16)(W/16), 128), run dtype
        (the VAE posterior's mean, as the pipelines encode reference images)."""
        run = self._vae_encoder_runner(pixels.shape[2], pixels.shape[3])
        out = run({"image": pixels.astype(self.dtype.np)})
        return require_finite("image latents", next(iter(out.values())))

    def encode_images(self, req: ImageRequest, h: int, w: int) -> ImageConditioning | None:
        """The request's conditioning images as reference tokens (an init image first, as the inpainting
        pipeline conditions on it), with the init image's latents and the mask per token for img2img."""
        if not req.ref_images and req.init_image is None:
            return None
        ppt = self.pixels_per_token
        parts = [self.encode_image(reference_pixels(r, ppt)) for r in req.ref_images]
        init = mask = None
        if req.init_image is not None:
            init = self.encode_image(init_pixels(req.init_image, ppt))
            parts.insert(0, init)
            if req.mask is not None:
                mask = mask_tokens(req.mask, w * ppt, h * ppt, ppt)
        refs = ReferenceTokens(np.concatenate(parts, axis=1), tuple(self._ref_grids(req)))
        if self.uses_kv_cache(req):
            refs = ReferenceTokens(refs.tokens, refs.shapes, self.reference_kv(refs))
        return ImageConditioning(refs, init, mask)

    # -- stages --------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.checkpoint.tokenizer_dir)
        return self._tokenizer

    def prefetch_prompts(self, prompts: Sequence[str]) -> None:
        tokenizer = self.tokenizer
        tokenizer.prefetch([klein_prompt_text(tokenizer, prompt) for prompt in prompts])

    def encode(self, prompt: str) -> np.ndarray:
        """Text features (1, L, 3 * hidden) in the run dtype: [h9 | h18 | h27] per token, pads included
        (L = `text_length`, 512 for the published checkpoints)."""
        cfg = self.checkpoint.configs.text_encoder
        ids, mask = tokenize_prompts(self.tokenizer, [prompt], self.text_length)
        cos, sin = qwen3_rope_tables(cfg, self.text_length, dtype=self.dtype)
        run = self._text_runner()
        out = run({"input_ids": ids, "attention_mask": mask, "rope_cos": cos, "rope_sin": sin})
        return require_finite("text features", next(iter(out.values())))

    def predictor(self, h: int, w: int, images: ImageConditioning | None = None) -> Predict:
        """The denoiser at h x w tokens: (latents (B, h*w, 128), t, text features (1, L, D)) -> velocity
        (B, h*w, 128). Reference tokens in `images.context` follow the latents in the sequence (each image
        at RoPE time 10, 20, ...), as Flux2KleinPipeline orders them; their outputs are dropped."""
        cfg = self.checkpoint.configs.transformer
        refs: ReferenceTokens | None = None if images is None else images.context
        cached = refs is not None and refs.kv is not None
        shapes = () if refs is None or cached else refs.shapes
        n_img = h * w
        if (h, w, shapes) not in self._rope:
            tables = flux2_rope_tables(
                self.text_length, h, w, ref_shapes=shapes, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta
            )
            self._rope[h, w, shapes] = tuple(map(step_invariant, tables))  # type: ignore[assignment]
        cos, sin = self._rope[h, w, shapes]
        tiled: dict[int, dict[str, np.ndarray]] = {}  # reference tokens repeated over a batch, once per run

        def predict(latents: np.ndarray, t: float, text: np.ndarray) -> np.ndarray:
            batch = latents.shape[0]
            x, extra = latents, {}
            if refs is not None and refs.kv is not None:
                extra = refs.kv  # (1, n_ref, heads, head_dim): the program repeats them over the batch
                run = self._transformer_runner(n_img, batch, n_ref_cached=refs.tokens.shape[1])
            else:
                if refs is not None:
                    if batch not in tiled:
                        tiled[batch] = {"tokens": np.repeat(refs.tokens, batch, axis=0).astype(latents.dtype)}
                    x = np.concatenate([latents, tiled[batch]["tokens"]], axis=1)
                run = self._transformer_runner(x.shape[1], batch)
            t_proj = flux2_timestep_proj([t] * batch, dtype=self.dtype, channels=cfg.timestep_guidance_channels)
            inputs = {
                "latents": x,
                "text_features": np.repeat(text, batch, axis=0) if text.shape[0] != batch else step_invariant(text),
                "timestep_proj": t_proj,
                "rope_cos": cos,
                "rope_sin": sin,
                **extra,
            }
            out = next(iter(run(inputs).values()))
            return out if out.shape[1] == n_img else np.ascontiguousarray(out[:, :n_img])

        return predict

    def decode(self, latents: np.ndarray, h: int, w: int) -> np.ndarray:
        """(H, W, 3) uint8 from packed latents, rounded as the reference image processor does (whole: on the
        decoder's backend; by tiles: on the host, after the tiles are blended)."""
        layout = self._tiles.get((h, w))
        if layout is None:
            pixels, probe = self._vae_runner(h, w)({"latents": latents}).values()
            require_finite_probe("decoded image", probe)
            return pixels
        latent = next(iter(self._latent_runner(h, w)({"latents": latents}).values()))

        def decode_tile(tile: np.ndarray) -> np.ndarray:
            run = self._vae_tile_runner(tile.shape[2], tile.shape[3])
            return next(iter(run({"latent": tile.astype(self.dtype.np)}).values()))

        image = decode_tiled(latent, layout, decode_tile)
        return to_uint8(require_finite("decoded image", image)[0])

    # -- the whole path ------------------------------------------------------------------------
    def resolve(self, req: GenerationRequest) -> tuple[int, float, bool, list[str]]:
        """(steps, guidance, use_cfg, warnings) with the distilled/base defaults and rules; the size
        must be a multiple of the token size (`UsageError`)."""
        self.check_model_inputs(req)
        if req.mask is not None and req.sampler != "euler":  # the blend follows each Euler step (the reference's)
            raise UsageError(
                f"--mask (inpainting) runs with the euler sampler, not {req.sampler}",
                hint="leave --sampling-method out, or drop --mask for img2img",
            )
        if req.kv_cache and req.init_image is not None:
            raise UsageError("--kv-cache is for reference images (-r), not for img2img / inpainting (-i)")
        if req.init_image is not None:
            if req.ref_images:
                raise UsageError("-i / --init-image with -r / --ref-image is not supported: give one or the other")
            check_size(*self.size(req), self.pixels_per_token)  # an init image under one token is refused here
            fitted = self.size(req)
            for name, asked, got in (("width", req.width, fitted[0]), ("height", req.height, fitted[1])):
                if asked is not None and asked != got:
                    raise UsageError(
                        f"{name} {asked} differs from the init image's {got} ({req.init_image.name})",
                        hint="img2img runs at the init image's size (cut to a multiple of the token size); "
                        "leave -W / -H out",
                    )
        self.fit_size(*self.size(req))
        warnings: list[str] = []
        kv_checkpoint = self.checkpoint.configs.pipeline.kv_cache
        if req.ref_images and self.uses_kv_cache(req) and not kv_checkpoint:
            warnings.append(
                "--kv-cache runs klein KV's reference attention (references attend only to themselves, at "
                "timestep 0); this checkpoint is not a KV one, so the edit differs from its full-attention one"
            )
        if req.ref_images and kv_checkpoint and not self.uses_kv_cache(req):
            warnings.append("--no-kv-cache on a KV checkpoint runs Flux2KleinPipeline's full joint attention")
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
            dtype=self.dtype, schedule=self.schedule, guidance=guidance, batch=req.batch,
        )  # fmt: skip
        return steps, guidance, use_cfg, warnings

    def initial_noise(self, req: GenerationRequest, h: int, w: int) -> np.ndarray:
        """Packed initial latents (B, h*w, 128) in the run dtype: image i from seed + i, or `init_noise`
        (B rows, unpacked or packed)."""
        c, b = self.checkpoint.configs.transformer.in_channels, req.batch
        what = f"{w * self.pixels_per_token}x{h * self.pixels_per_token}" + (f" x {b} images" if b > 1 else "")
        if req.init_noise is not None or b == 1:
            return initial_latents(
                req.init_noise, req.seed, unpacked=(b, c, h, w), packed=(b, h * w, c), pack=pack_noise,
                dtype=self.dtype, what=what, rng=req.rng,
            )  # fmt: skip
        rows = [
            initial_latents(
                None,
                req.seed + i,
                unpacked=(1, c, h, w),
                packed=(1, h * w, c),
                pack=pack_noise,
                dtype=self.dtype,
                what=what,
                rng=req.rng,
            )  # fmt: skip
            for i in range(b)
        ]
        return np.concatenate(rows, axis=0)

    def fit_size(self, width: int, height: int) -> tuple[int, int, list[str]]:
        """The size itself: `UsageError` unless it is on the token grid."""
        check_size(width, height, self.pixels_per_token)
        return width, height, []

    def schedule(self, image_tokens: int, steps: int) -> FlowMatchSchedule:
        return klein_schedule(image_tokens, steps, load_scheduler_config(self.checkpoint.root, missing=KLEIN_SCHEDULER))

    def run_keys(self) -> dict[str, Any]:
        ck = self.checkpoint
        keys: dict[str, Any] = {"model": ck.name, "distilled": ck.is_distilled, "layout": ck.layout}
        if ck.loras is not None and (mode := ck.loras.current()) is not None:
            keys["lora"] = mode.to_dict()  # merged or unmerged, why, and the adapters now (`dif.lora.mode`)
        tiled = [layout for layout in self._tiles.values() if layout is not None]
        if tiled:
            keys["vae_decode"] = f"tiled, tiles of {tiled[0].tile} latent pixels blended over {tiled[0].blend} pixels"
        return keys
