"""MiniMax-H3 text-to-video+audio (t2va): prompt -> Qwen3-VL hidden_states[50] -> packed DiT loop over two
schedules -> video VAE (chunked, tiled) and audio VAE -> frames + stereo 32 kHz -> MP4.

Frontend stage, the whole product path. Programs (text encoder, DiT for the request's layout, the video
decoder for its tile shape, the audio decoder) are built, bound and prepared on one backend under one
memory budget (`ProgramCache`: the text encoder's stage ends before the DiT's, so the budget can release
it). The loop is the reference's (modular_pipelines/minimax_h3/denoise.py), guidance-distilled, one
forward per step:
  per step i: t_v, t_a = video / audio timesteps[i]; rows tagged text and video take t_v, audio t_a
              (conditioning rows max(t_v, 0.999)); (v_video, v_audio) = DiT(...)
              each stream: x0 = x + (1 - t) v, x' = r x + (1 - r) x0 with r = sigma_{i+1} / sigma_i (fp32)
Latents stay float32 the whole loop. Noise: video (1, C, T', H/16, W/16) first, then audio rows (2A, C),
from one numpy PCG64(seed) stream, or with `--rng torch-cpu` / `torch-cuda` the reference's draws from one
torch generator, keyframes first (or the caller's arrays, for parity with another tool).
fl2va (`VideoRequest.keyframes`): each keyframe through the video VAE encoder, noised to t = 0.999 and packed
as conditioning rows ahead of the generated video rows, held fixed through the loop; the text is the reference's
presentation, `"<Picture i>: "` + a vision block per keyframe (the Qwen3-VL vision tower, rows tagged video)
before the prompt, when the checkpoint holds the vision tower and a processor/ folder (else a warning says the
text has no picture blocks).
Decoding is a separate stage (`decode_video`, `decode_audio`) that can be run on latents alone.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from attrs import define, field, frozen

from dif.dtypes import DType
from dif.errors import CheckpointError, DifError, DifWarning, UsageError
from dif.ir.program import Program
from dif.kit.finite import require_finite
from dif.program_cache import ProgramCache
from dif.runtime import Runner
from dif.text import TextTokenizer
from dif_frontend_h3.config import AUDIO_CHANNELS, FPS, H3Configs
from dif_frontend_h3.layout import (
    PackedLayout,
    audio_rows_to_latents,
    audio_samples,
    layout_for,
    patchify,
    unpatchify,
)
from dif_frontend_h3.model import build_denoiser, rope_tables, time_proj
from dif_frontend_h3.presentation import PicturePrompt, fl2va_presentation
from dif_frontend_h3.schedule import H3Schedule
from dif_frontend_h3.text_encoder import build_text_encoder, prompt_ids, text_inputs
from dif_frontend_h3.vision_config import H3VisionConfig, ImageProcessorConfig
from dif_frontend_h3.weights import (
    H3Checkpoint,
    bind_denoiser,
    bind_text_encoder,
    bind_vision_tower,
    has_vision_tower,
)

PREPROCESSOR = "preprocessor_config.json"  # the image processor's settings, in the folder's processor/
KEYFRAME_T = 0.999  # the t keyframe anchors are noised to and held at (modular_pipeline.py keyframe_noise_aug)
StepCallback = Callable[[int, int, np.ndarray, np.ndarray], None]  # (step, steps, video rows, audio rows)
TileCallback = Callable[[int, int], None]  # (tiles done, tiles in all)


@frozen(eq=False)
class Keyframe:
    """An fl2va keyframe: which end of the video it is anchored to ("first" | "last") and its RGB pixels
    (H, W, 3) uint8 at the video's size; `name` for messages (its file)."""

    anchor: str
    pixels: np.ndarray
    name: str = "keyframe"


@frozen
class VideoRequest:
    """One t2va job (fl2va with `keyframes`): prompt, frames (17n + 5), size (multiples of 32), grid points
    `steps` (steps - 1 model evaluations, as the reference counts), seed and its generator `rng`;
    `video_noise` (1, C, T', H/16, W/16) / `audio_noise` (2A, C) float32 replace the seeded draws."""

    prompt: str
    frames: int
    width: int
    height: int
    steps: int
    seed: int = 0
    video_noise: np.ndarray | None = field(default=None, eq=False)
    audio_noise: np.ndarray | None = field(default=None, eq=False)
    keyframes: tuple[Keyframe, ...] = field(default=(), eq=False)
    rng: str = "numpy"  # `dif.rng.RNGS`: the seeded noise's generator (`H3Pipeline.initial_noise`)

    @property
    def anchors(self) -> tuple[str, ...]:
        return tuple(k.anchor for k in self.keyframes)


@frozen(eq=False)
class VideoResult:
    """What a run produced: latents always; frames (F, H, W, 3) uint8 and audio (2, N) float32 when decoded."""

    video_latents: np.ndarray
    audio_latents: np.ndarray
    frames: np.ndarray | None
    audio: np.ndarray | None
    timings: dict[str, float]
    settings: dict[str, Any]


@frozen(eq=False)
class H3Noise:
    """The noise a run starts from (`H3Pipeline.initial_noise`), float32: one (1, C, 1, h, w) per keyframe,
    the video latents (1, C, T', h, w) and the audio rows (2A, C)."""

    keyframes: list[np.ndarray]
    video: np.ndarray
    audio: np.ndarray


@define
class H3Pipeline:
    """Runs one checkpoint at one dtype on one backend; programs are cached per shape."""

    checkpoint: H3Checkpoint
    dtype: DType = DType.F32
    backend: str | None = None  # a dif backend name, None for the default, "interp" for the reference interpreter
    on_step: StepCallback | None = None
    on_tile: TileCallback | None = None
    on_stage: Callable[[str, float], None] | None = None
    vram_budget: int | None = None
    _programs: ProgramCache = field(init=False)
    _tokenizer: TextTokenizer | None = field(init=False, default=None)
    _vision: tuple[H3VisionConfig, ImageProcessorConfig] | None | bool = field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._programs = ProgramCache(self.backend, vram_budget=self.vram_budget)

    @property
    def configs(self) -> H3Configs:
        return self.checkpoint.configs

    def memory_report(self) -> dict[str, Any]:
        """What the programs hold on the device and the pipeline's residency decision (`ProgramCache`)."""
        return self._programs.memory_report()

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None:
            self._tokenizer = TextTokenizer.from_folder(self.checkpoint.tokenizer_dir)
        return self._tokenizer

    @property
    def vision(self) -> tuple[H3VisionConfig, ImageProcessorConfig] | None:
        """The vision tower's and the image processor's configs when the checkpoint can build fl2va's picture
        blocks (`model.visual.*` in text_encoder/ and a processor/ folder), else None."""
        if self._vision is False:
            ck = self.checkpoint
            processor = ck.root / "processor"
            found = has_vision_tower(ck.text_encoder, ck.text_prefix) and (processor / PREPROCESSOR).is_file()
            self._vision = None
            if found:
                from dif_frontend_h3.config import read_json

                vcfg = H3VisionConfig.from_dict(read_json(ck.root / "text_encoder" / "config.json"))
                self._vision = (vcfg, ImageProcessorConfig.from_folder(processor))
        assert self._vision is not False
        return self._vision

    def pictures(self, req: VideoRequest) -> PicturePrompt | None:
        """fl2va's presentation with picture blocks; None for t2va or a checkpoint without the vision tower."""
        if not req.keyframes or self.vision is None:
            return None
        vcfg, pcfg = self.vision
        return fl2va_presentation(self.tokenizer, vcfg, pcfg, req.prompt, [k.pixels for k in req.keyframes])

    # -- checks, before anything runs ----------------------------------------------------------
    def check(self, req: VideoRequest, *, decode: bool = True) -> PackedLayout:
        """The request's layout; `UsageError` for frames not 17n + 5, a size not a multiple of 32, steps < 2,
        an empty prompt; `CheckpointError` when decoding needs a VAE the checkpoint lacks."""
        if req.steps < 2:
            raise UsageError(f"--steps {req.steps}: MiniMax-H3 needs at least 2 grid points (1 model evaluation)")
        for k in req.keyframes:
            if k.anchor not in ("first", "last"):
                raise UsageError(f"{k.name}: a keyframe is anchored 'first' or 'last', not {k.anchor!r}")
            if k.pixels.shape != (req.height, req.width, 3) or k.pixels.dtype != np.uint8:
                raise UsageError(
                    f"{k.name} is {k.pixels.shape[1]}x{k.pixels.shape[0]}: the {k.anchor} frame must be the video's "
                    f"size, {req.width}x{req.height} (RGB)",
                    hint=f"resize or crop it to {req.width}x{req.height}, or pass -W {k.pixels.shape[1]} "
                    f"-H {k.pixels.shape[0]} if that is a multiple of 32",
                )
        if len(set(req.anchors)) != len(req.anchors):
            raise UsageError(f"one keyframe per end of the video, got anchors {list(req.anchors)}")
        pictures = self.pictures(req)
        if pictures is None:
            text_len, tags = prompt_ids(self.tokenizer, req.prompt).shape[1], None
        else:
            text_len, tags = len(pictures.ids), pictures.tags
        layout = layout_for(self.configs, text_len, req.frames, req.width, req.height, req.anchors, tags)
        self._check_noise(req, layout)
        if req.keyframes:
            self.require_decoders(audio=False)  # the keyframes go through the video VAE's encoder
        if decode:
            self.require_decoders()
            self._check_decodable(req.frames, layout.num_latent_frames)
        return layout

    def _check_decodable(self, frames: int, num_latent_frames: int) -> None:
        """`UsageError` when the video VAE cannot decode `num_latent_frames` (it decodes whole chunks: 17n + 5
        frames with n = 0 give 2 latent frames, fewer than one chunk), before any program is built."""
        from dif_frontend_h3.layout import latent_frames
        from dif_frontend_h3.vae_config import VideoVaeConfig
        from dif_frontend_h3.video_vae_tiling import chunk_plan

        assert self.configs.vae_config is not None
        vcfg = VideoVaeConfig.from_dict(self.configs.vae_config)
        v = self.configs.video_vae

        def decodable(t: int) -> bool:
            try:
                chunk_plan(vcfg, t)
            except DifError:
                return False
            return True

        if decodable(num_latent_frames):
            return
        counts = range(v.latents_per_clip, 100 * v.clip_length, v.clip_length)  # 17n + 5 for n = 0 .. 99
        fewest = next((f for f in counts if decodable(latent_frames(f, v.clip_length, v.latents_per_clip))), None)
        raise UsageError(
            f"--frames {frames}: the video VAE decodes whole chunks and {frames} frames ({num_latent_frames} latent "
            f"frames) are fewer than one" + ("" if fewest is None else f"; the fewest frames it decodes is {fewest}")
        )

    def video_request(
        self,
        prompt: str,
        *,
        frames: int | None = None,
        width: int | None = None,
        height: int | None = None,
        steps: int | None = None,
        seed: int = 0,
        first_frame: np.ndarray | None = None,
        last_frame: np.ndarray | None = None,
        rng: str = "numpy",
    ) -> VideoRequest:
        """A `VideoRequest` from plain values, settings left None taking the checkpoint's defaults (as `dif h3
        generate`); keyframes (H, W, 3) uint8. For callers that reach this frontend only through
        `FrontendInfo.pipeline` (`dif serve`: dif-tools imports no frontend); `check` still judges it."""
        from dif_frontend_h3.cli import checkpoint_defaults

        given = {"frames": frames, "width": width, "height": height, "steps": steps}
        d = {**checkpoint_defaults(self.checkpoint.root), **{k: v for k, v in given.items() if v is not None}}
        ends = (("first", first_frame), ("last", last_frame))
        keyframes = tuple(Keyframe(anchor, pixels, f"{anchor}_frame") for anchor, pixels in ends if pixels is not None)
        size = (d["frames"], d["width"], d["height"], d["steps"])
        return VideoRequest(prompt, *size, seed, keyframes=keyframes, rng=rng)

    def save_mp4(self, result: VideoResult, path: str | Path, *, version: str = "") -> Path:
        """Write a decoded `result` as `dif h3 generate` does (`dif.media.mp4.write_mp4`: H.264 + AAC, by temp +
        rename): an A1111-style parameters line in `comment`, the run's settings and `version` as JSON."""
        from dif.media.mp4 import write_mp4

        if result.frames is None or result.audio is None:
            raise UsageError("this result was not decoded (latents only): there are no frames or sound to write")
        s = result.settings
        parameters = (f"{s['prompt']}\nSteps: {s['steps']}, Seed: {s['seed']}, Size: {s['width']}x{s['height']}, "
                      f"Frames: {s['frames']}, FPS: {s['fps']}, Model: {s['model']}")  # fmt: skip
        rate = self.configs.audio_vae.sampling_rate
        return write_mp4(path, result.frames, s["fps"], audio=result.audio, sample_rate=rate, parameters=parameters,
                         metadata={"dif": {**s, "version": version}})  # fmt: skip

    def require_decoders(self, *, video: bool = True, audio: bool = True) -> None:
        """`CheckpointError` naming the folder when a VAE needed to decode is missing."""
        ck = self.checkpoint
        parts = [("vae", ck.vae, self.configs.vae_config)] if video else []
        parts += [("audio_vae", ck.audio_vae, self.configs.audio_vae_config)] if audio else []
        for part, source, config in parts:
            if source is None or config is None:
                what = "video VAE" if part == "vae" else "audio VAE"
                raise CheckpointError(
                    f"{ck.root}: no {part}/ folder: the {what} is needed to decode the "
                    f"{'frames' if part == 'vae' else 'soundtrack'}",
                    hint="use a complete MiniMax-H3 folder, or --latents-only to stop after sampling",
                )

    def _check_noise(self, req: VideoRequest, layout: PackedLayout) -> None:
        c, ca = self.configs.transformer.in_channels, self.configs.transformer.audio_in_channels
        want = {"video": (1, c, layout.num_latent_frames, layout.latent_height, layout.latent_width),
                "audio": (layout.audio_rows, ca)}  # fmt: skip
        for name, arr in (("video", req.video_noise), ("audio", req.audio_noise)):
            if arr is not None and tuple(np.shape(arr)) != want[name]:
                raise UsageError(f"{name} noise has shape {tuple(np.shape(arr))}, this request needs {want[name]}")

    # -- programs ------------------------------------------------------------------------------
    def _text_runner(self, seq_len: int) -> Runner:
        cfg, tap = self.configs.text_encoder, self.configs.text_encoder_layer

        def build() -> tuple[Program, Mapping[str, np.ndarray]]:
            prog = build_text_encoder(cfg, seq_len=seq_len, tap=tap, dtype=self.dtype)
            return prog, bind_text_encoder(prog, self.checkpoint.text_encoder, self.checkpoint.text_prefix)

        return self._programs.get(("text_encoder", seq_len), build, "encode")

    def _vision_runner(self, images: int, grid_h: int, grid_w: int) -> Runner:
        from dif_frontend_h3.vision_tower import build_vision_tower

        assert self.vision is not None
        vcfg = self.vision[0]

        def build() -> tuple[Program, Mapping[str, np.ndarray]]:
            prog = build_vision_tower(vcfg, images=images, grid_h=grid_h, grid_w=grid_w, dtype=self.dtype)
            return prog, bind_vision_tower(prog, self.checkpoint.text_encoder, self.checkpoint.text_prefix)

        return self._programs.get(("vision_tower", images, grid_h, grid_w), build, "encode")

    def _picture_text_runner(self, seq_len: int, vision_rows: int) -> Runner:
        from dif_frontend_h3.vision_text import build_vision_text_encoder

        assert self.vision is not None
        cfg, vcfg, tap = self.configs.text_encoder, self.vision[0], self.configs.text_encoder_layer

        def build() -> tuple[Program, Mapping[str, np.ndarray]]:
            prog = build_vision_text_encoder(cfg, vcfg, seq_len=seq_len, vision_rows=vision_rows, tap=tap,
                                             dtype=self.dtype)  # fmt: skip
            return prog, bind_text_encoder(prog, self.checkpoint.text_encoder, self.checkpoint.text_prefix)

        return self._programs.get(("picture_text_encoder", seq_len, vision_rows), build, "encode")

    def _picture_runners(self, p: PicturePrompt) -> tuple[Runner, Runner]:
        assert self.vision is not None
        _, gh, gw = p.grid
        rows = p.images * gh * gw // self.vision[0].merge_unit
        return self._vision_runner(p.images, gh, gw), self._picture_text_runner(len(p.ids), rows)

    def _denoiser_runner(self, layout: PackedLayout) -> Runner:
        key = ("denoiser", layout.text_len, layout.condition_rows, layout.audio_rows, layout.num_latent_frames,
               layout.latent_height, layout.latent_width)  # fmt: skip

        def build() -> tuple[Program, Mapping[str, np.ndarray]]:
            prog = build_denoiser(self.configs.transformer, layout, dtype=self.dtype)
            return prog, bind_denoiser(prog, self.checkpoint.transformer)

        return self._programs.get(key, build, "denoise", keep_fp8=True)  # fp8-e4m3 weights stay fp8 where executed

    # -- stages --------------------------------------------------------------------------------
    def encode(self, prompt: str) -> np.ndarray:
        """Text features (1, L, text_dim) in the run dtype: hidden_states[tap] of the prompt verbatim."""
        ids = prompt_ids(self.tokenizer, prompt)
        run = self._text_runner(ids.shape[1])
        out = run(text_inputs(self.configs.text_encoder, ids, dtype=self.dtype))
        return require_finite("text features", next(iter(out.values())))

    def encode_pictures(self, p: PicturePrompt) -> np.ndarray:
        """Text features (1, L, text_dim) of fl2va's presentation with picture blocks: the vision tower over
        the keyframes, then the text stack with their rows (3-D mRoPE, deepstack) read at the tap."""
        from dif_frontend_h3.vision_text import deepstack_used, picture_inputs
        from dif_frontend_h3.vision_tower import vision_inputs

        assert self.vision is not None
        vcfg = self.vision[0]
        _, gh, gw = p.grid
        tower, text = self._picture_runners(p)
        feats = list(tower(vision_inputs(vcfg, p.pixel_values, gh, gw, p.images, dtype=self.dtype)).values())
        inputs = picture_inputs(self.configs.text_encoder, vcfg, p.ids, p.grids, dtype=self.dtype)
        inputs["image_embeds"] = feats[0]  # the tower's outputs in order: embeds, then each deepstack feature
        for j in range(deepstack_used(vcfg, self.configs.text_encoder_layer)):
            inputs[f"deepstack_{j}"] = feats[1 + j]
        return require_finite("text features", next(iter(text(inputs).values())))

    def initial_noise(self, req: VideoRequest, layout: PackedLayout) -> H3Noise:
        """Every noise a run starts from, float32: the request's arrays where it gives them, the rest drawn from
        `req.rng` seeded with `req.seed`. "torch-cpu" / "torch-cuda" draw in the reference's order from one
        torch generator (`dif.rng.NoiseStream`): each keyframe's (1, C, 1, h, w), then the video latents, then
        the audio rows; a given array skips its draw, as diffusers' `latents=` does. "numpy" draws the video
        then the audio from PCG64(seed) and the keyframes from PCG64((seed, 1)), so a t2va and an fl2va run of
        one seed share their video and audio noise."""
        from dif.rng import NoiseStream

        c, ca = self.configs.transformer.in_channels, self.configs.transformer.audio_in_channels
        r = self.configs.video_vae.spatial_ratio
        stream = NoiseStream(req.seed, req.rng)
        draw_keyframe = stream.standard_normal
        if req.rng == "numpy":
            own = np.random.Generator(np.random.PCG64([req.seed, 1]))
            draw_keyframe = partial(own.standard_normal, dtype=np.float32)
        keyframes = [draw_keyframe((1, c, 1, req.height // r, req.width // r)) for _ in req.keyframes]
        shape = (1, c, layout.num_latent_frames, layout.latent_height, layout.latent_width)
        video = stream.standard_normal(shape) if req.video_noise is None else req.video_noise
        audio = stream.standard_normal((layout.audio_rows, ca)) if req.audio_noise is None else req.audio_noise
        return H3Noise([np.asarray(k, np.float32) for k in keyframes], np.asarray(video, np.float32),
                       np.asarray(audio, np.float32))  # fmt: skip

    def sample(
        self,
        text: np.ndarray,
        layout: PackedLayout,
        video: np.ndarray,
        audio_rows: np.ndarray,
        steps: int,
        condition_rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The denoising loop from noise: video latents (1, C, T', h, w) and audio rows (2A, C), float32 out.
        `condition_rows` (layout.condition_rows, C p p): the keyframe rows of an fl2va layout (`condition_rows`),
        held fixed in front of the generated rows."""
        cfg = self.configs.transformer
        vs = H3Schedule.make(steps, self.configs.scheduler.shift)
        aus = H3Schedule.make(steps, self.configs.audio_scheduler.shift)
        n = min(len(vs), len(aus))  # the reference zips the two timestep lists
        p = cfg.patch_size[2]
        v_rows = patchify(video, p)
        have = 0 if condition_rows is None else len(condition_rows)
        if have != layout.condition_rows:
            raise UsageError(f"the layout holds {layout.condition_rows} conditioning rows, {have} were given")
        if condition_rows is not None:
            v_rows = np.concatenate([np.asarray(condition_rows, np.float32), v_rows])
        v_rows = v_rows[None]
        a_rows = np.asarray(audio_rows, np.float32)[None]
        run = self._denoiser_runner(layout)
        cos, sin = rope_tables(cfg, layout.position_ids, dtype=self.dtype)
        fixed = {"text_embeds": text.astype(self.dtype.np), "rope_cos": cos, "rope_sin": sin}
        for i in range(n):
            t_v, t_a = float(vs.timesteps[i]), float(aus.timesteps[i])
            inputs = {**fixed, "video_latents": v_rows, "audio_latents": a_rows,
                      "time_proj": time_proj(layout.row_timesteps(t_v, t_a), cfg.freq_dim)}  # fmt: skip
            out = run(inputs)
            vel_v, vel_a = list(out.values())  # the program's outputs in order: video, audio
            c = layout.condition_rows  # only generated rows are stepped; conditioning rows ride unchanged
            v_rows = v_rows.copy()
            v_rows[:, c:] = vs.step(i, vel_v[:, c:], v_rows[:, c:])
            a_rows = aus.step(i, vel_a, a_rows)
            require_finite(f"latents after step {i + 1}", v_rows)
            if self.on_step is not None:
                self.on_step(i + 1, n, v_rows, a_rows)
        c = layout.condition_rows
        latents = unpatchify(v_rows[0, c:], cfg.in_channels, layout.num_latent_frames, layout.latent_height,
                             layout.latent_width, p)  # fmt: skip
        return latents, a_rows[0]

    @staticmethod
    def condition_rows(latents: list[np.ndarray], noise: list[np.ndarray], patch: int = 2) -> np.ndarray:
        """Keyframe conditioning rows: each normalized keyframe latent (1, C, 1, h, w) noised to the anchor level
        t = 0.999 (`t z + (1 - t) eps`, fp32, as the scheduler's `scale_noise`), patchified, in packed order."""
        t = np.float32(KEYFRAME_T)
        rows = [patchify((t * np.asarray(z, np.float32) + (np.float32(1.0) - t) * np.asarray(e, np.float32)), patch)
                for z, e in zip(latents, noise, strict=True)]  # fmt: skip
        return np.concatenate(rows).astype(np.float32)

    def _video_encoder(self, height: int, width: int) -> tuple[Any, Runner]:
        """(VideoVaeConfig, the encoder runner for one pixel tile of height x width; fp32 as the reference)."""
        from dif_frontend_h3.vae_config import VideoVaeConfig
        from dif_frontend_h3.vae_weights import bind_video_vae
        from dif_frontend_h3.video_vae_encoder import build_video_encoder

        self.require_decoders(audio=False)
        assert self.configs.vae_config is not None and self.checkpoint.vae is not None
        vcfg = VideoVaeConfig.from_dict(self.configs.vae_config)
        source = self.checkpoint.vae

        def build() -> tuple[Program, Mapping[str, np.ndarray]]:
            prog = build_video_encoder(vcfg, height=height, width=width)
            return prog, bind_video_vae(prog, source)

        return vcfg, self._programs.get(("video_encoder", height, width), build, "encode")

    def encode_keyframe(self, pixels: np.ndarray) -> np.ndarray:
        """RGB (H, W, 3) uint8 -> the normalized conditioning latent (1, C, 1, H/16, W/16) float32: ImageNet
        pixels, the tiled CNN encoder, the posterior sampled under seed 42 and rounded to fp16, as the
        reference's `encode_vae_condition`."""
        from dif_frontend_h3.video_vae_tiling import encode_moments, normalize_pixels, sample_keyframe_latents

        x = normalize_pixels(np.asarray(pixels, np.uint8).transpose(2, 0, 1)[None, :, None])  # (1, 3, 1, H, W)
        from dif_frontend_h3.vae_config import VideoVaeConfig

        self.require_decoders(audio=False)
        assert self.configs.vae_config is not None
        vcfg = VideoVaeConfig.from_dict(self.configs.vae_config)

        def run_tile(tile: np.ndarray) -> np.ndarray:
            run = self._video_encoder(tile.shape[-2], tile.shape[-1])[1]
            return next(iter(run({"pixels": tile}).values()))

        moments = encode_moments(vcfg, x, run_tile)
        return require_finite("keyframe latent", sample_keyframe_latents(vcfg, moments))

    def _video_decoder(self, latent_shape: tuple[int, ...]) -> tuple[Any, Runner]:
        """(VideoVaeConfig, the decoder runner for the tile shape a decode of `latent_shape` needs)."""
        from dif_frontend_h3.vae_config import VideoVaeConfig
        from dif_frontend_h3.vae_weights import bind_video_vae
        from dif_frontend_h3.video_vae import build_video_decoder
        from dif_frontend_h3.video_vae_tiling import decode_tile_shape

        self.require_decoders(audio=False)
        assert self.configs.vae_config is not None and self.checkpoint.vae is not None
        vcfg = VideoVaeConfig.from_dict(self.configs.vae_config)
        frames, height, width = decode_tile_shape(vcfg, latent_shape)
        source = self.checkpoint.vae

        def build() -> tuple[Program, Mapping[str, np.ndarray]]:
            prog = build_video_decoder(vcfg, frames=frames, height=height, width=width, dtype=self.dtype)
            return prog, bind_video_vae(prog, source)

        return vcfg, self._programs.get(("video_decoder", frames, height, width), build, "decode")

    def decode_video(self, latents: np.ndarray) -> np.ndarray:
        """Video latents (1, C, T', h, w) -> frames (F, H, W, 3) uint8 through the video VAE (chunked, tiled)."""
        from dif_frontend_h3.video_vae_tiling import decode_video

        vcfg, run = self._video_decoder(latents.shape)
        rgb = decode_video(vcfg, latents, lambda inputs: next(iter(run(inputs).values())), progress=self.on_tile)
        rgb = require_finite("decoded frames", rgb)[0]  # (3, F, H, W) in [0, 1]
        return np.ascontiguousarray((np.round(rgb * 255.0)).clip(0, 255).astype(np.uint8).transpose(1, 2, 3, 0))

    def prepare_all(self, layout: PackedLayout, *, decode: bool, pictures: PicturePrompt | None = None) -> None:
        """Register every program of one run under the pipeline's one budget (`ProgramCache.planning`): the
        memory decision then says which stay resident across stages (the text encoder is released before
        the DiT when they do not fit together). With `pictures`, the vision tower and the text stack over
        the picture blocks take the text encoder's place."""
        with self._programs.planning():
            if pictures is None:
                self._text_runner(layout.text_len)
            else:
                self._picture_runners(pictures)
            self._denoiser_runner(layout)
            if decode:
                c = self.configs.transformer.in_channels
                self._video_decoder((1, c, layout.num_latent_frames, layout.latent_height, layout.latent_width))
                self._audio_decoder(layout.num_audio_latents)

    def _audio_decoder(self, num_audio_latents: int) -> tuple[Any, Runner]:
        """(AudioVaeConfig, the audio decoder runner for `num_audio_latents` per channel; fp32, as the
        reference pins it)."""
        from dif_frontend_h3.audio_vae import build_audio_decoder
        from dif_frontend_h3.vae_config import AudioVaeConfig
        from dif_frontend_h3.vae_weights import bind_audio_vae

        self.require_decoders(video=False)
        assert self.configs.audio_vae_config is not None and self.checkpoint.audio_vae is not None
        acfg = AudioVaeConfig.from_dict(self.configs.audio_vae_config)
        source = self.checkpoint.audio_vae

        def build() -> tuple[Program, Mapping[str, np.ndarray]]:
            prog = build_audio_decoder(acfg, num_latents=num_audio_latents, batch=AUDIO_CHANNELS, dtype="f32")
            return prog, bind_audio_vae(prog, source)

        return acfg, self._programs.get(("audio_decoder", num_audio_latents), build, "decode")

    def decode_audio(self, audio_rows: np.ndarray, num_audio_latents: int) -> np.ndarray:
        """Channel-major audio rows (2A, C) -> stereo waveform (2, A hop) float32 in [-1, 1] at the VAE's rate."""
        from dif_frontend_h3.audio_vae import decode_audio

        acfg, run = self._audio_decoder(num_audio_latents)
        latents = audio_rows_to_latents(audio_rows, num_audio_latents)  # (2, C, A)
        wave = decode_audio(acfg, latents, lambda inputs: next(iter(run(inputs).values())))
        return require_finite("decoded audio", np.asarray(wave, np.float32))

    # -- the whole path ------------------------------------------------------------------------
    def generate(self, req: VideoRequest, *, decode: bool = True) -> VideoResult:
        """Everything from the prompt; `decode=False` stops after sampling (latents only)."""
        layout = self.check(req, decode=decode)
        timings: dict[str, float] = {}

        def stage(name: str, start: float) -> None:
            timings[name] = time.perf_counter() - start
            if self.on_stage is not None:
                self.on_stage(name, timings[name])

        pictures = self.pictures(req)
        t0 = time.perf_counter()
        self.prepare_all(layout, decode=decode, pictures=pictures)
        stage("load", t0)
        t0 = time.perf_counter()
        self._programs.enter("encode")
        text = self.encode(req.prompt) if pictures is None else self.encode_pictures(pictures)
        rows = None
        if req.keyframes and pictures is None:
            warnings.warn(
                "fl2va: the text has no picture blocks (this checkpoint has no Qwen3-VL vision tower "
                "`model.visual.*` or no processor/ folder): the keyframes condition the video through their "
                "latent rows only",
                DifWarning,
                stacklevel=2,
            )
        noise = self.initial_noise(req, layout)
        if req.keyframes:
            latents_k = [self.encode_keyframe(k.pixels) for k in req.keyframes]
            rows = self.condition_rows(latents_k, noise.keyframes, self.configs.transformer.patch_size[2])
        stage("encode", t0)
        t0 = time.perf_counter()
        self._programs.enter("denoise")
        latents, audio_rows = self.sample(text, layout, noise.video, noise.audio, req.steps, rows)
        stage("denoise", t0)
        frames = wave = None
        if decode:
            t0 = time.perf_counter()
            self._programs.enter("decode")
            frames = self.decode_video(latents)
            wave = self.decode_audio(audio_rows, layout.num_audio_latents)
            n = audio_samples(req.frames, self.configs.audio_vae.sampling_rate)
            if wave.shape[1] < n:
                raise DifError(f"audio decoder gave {wave.shape[1]} samples per channel, the video needs {n}")
            wave = wave[:, :n]
            stage("decode", t0)
        settings = {"prompt": req.prompt, "frames": req.frames, "fps": FPS, "width": req.width, "height": req.height,
                    "steps": req.steps, "seed": req.seed, "rng": req.rng, "dtype": self.dtype.value,
                    "model": self.checkpoint.name, "text_tokens": layout.text_len, "sequence_rows": layout.seq_len,
                    "keyframes": {k.anchor: k.name for k in req.keyframes}}  # fmt: skip
        return VideoResult(latents, audio_rows_to_latents(audio_rows, layout.num_audio_latents), frames, wave,
                           timings, settings)  # fmt: skip
