"""What every text-to-image pipeline shares around its model: the request, the timed encode ->
denoise -> decode stages after its "load" stage, and the `dif.report.ImageRun` they end in.

Where it sits: a frontend's pipeline (FLUX.2's, Krea 2's) subclasses `TextToImagePipeline` and
implements the model-specific work: `fit_size`, `resolve`, `schedule`, `initial_noise`,
`prepare_all`, `encode` / `encode_images` / `predictor` / `decode`, `run_keys` (and, optionally,
`prefetch_prompts`: tokenizing beside the load). `denoise` is the kit's
one sampling loop (`dif.kit.sampling.sample`), with the img2img start and the inpainting blend, and
`generate_batch` the one order of a run: resolve the request (size, steps, guidance, CFG, images), draw
the noise, make the schedule and prepare the programs in its "load" stage, then `run_batch` (a batch of
B images is one denoiser program with batch axis B, image i seeded `seed + i`). The CLI
(`dif.kit.commands`) and the Python API (`dif.load`) build the request with `image_request` from the
frontend's settings and the images read (`dif.media.image_input`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from attrs import evolve, frozen

from dif.dtypes import DType
from dif.errors import UsageError
from dif.kit.sampling import Predict, StepCallback, sample
from dif.media.image_input import InputImage, read_image
from dif.program_cache import ProgramCache
from dif.progress import stage_starting
from dif.report import ImageRun, image_settings
from dif.runstats import StageTimer, peak_rss_bytes
from dif.sched import FlowMatchSchedule, with_sampling
from dif.target import RuntimeBudget

if TYPE_CHECKING:
    from dif.parallel.cfg import CfgParallel


@frozen
class ImageRequest:
    """One text-to-image job; None settings take the checkpoint's defaults (the pipeline's `resolve`;
    width and height: its `native_size`). `init_noise` replaces the seeded noise (shapes: the
    pipeline's `initial_noise`)."""

    prompt: str
    negative_prompt: str = ""
    steps: int | None = None
    guidance: float | None = None
    seed: int = 0
    width: int | None = None
    height: int | None = None
    init_noise: np.ndarray | None = None
    ref_images: tuple[InputImage, ...] = ()  # reference images (FLUX.2 klein editing), in order
    init_image: InputImage | None = None  # img2img / inpainting source
    strength: float | None = None  # img2img: the fraction of the schedule run (None: 1.0 with init_image)
    mask: InputImage | None = None  # inpainting: white = repaint, the size of init_image
    batch: int = 1  # images in one program; image i uses seed + i
    kv_cache: bool | None = None  # reference tokens' K/V computed once (None: the checkpoint's default)
    sampler: str = "euler"  # `dif.sched.SAMPLERS`
    scheduler: str = "simple"  # `dif.sched.SCHEDULERS`: the sigmas respaced (`with_sampling`)
    rng: str = "numpy"  # `dif.rng.RNGS`: the seeded noise's generator


REQUEST_SETTINGS = ("steps", "guidance", "seed", "width", "height", "sampler", "scheduler", "rng")
"""The `ImageRequest` fields a frontend's settings (`dif.frontend.SettingSpec`) fill."""


IMAGE_INPUTS = ("ref_images", "init_image", "strength", "mask", "batch", "kv_cache")
"""The `ImageRequest` fields of what a run reads besides the prompt (`image_request`'s `inputs`)."""

MAX_BATCH = 64
"""The most images one request makes (`-b`); each is a row of the denoiser's batch axis."""


def image_request(
    prompt: str,
    settings: Mapping[str, Any],
    *,
    negative_prompt: str = "",
    init_noise: np.ndarray | None = None,
    **inputs: Any,
) -> ImageRequest:
    """The request of resolved `settings` (`FrontendInfo.resolve_settings`; a seed must be set);
    `UsageError` naming a setting the request has no field for. `inputs` are `IMAGE_INPUTS`: images as
    paths, PIL images or uint8 arrays (decoded here, `dif.media.image_input.read_image`), checked by
    `check_image_inputs` before anything loads."""
    extra = sorted(set(settings) - set(REQUEST_SETTINGS)) + sorted(set(inputs) - set(IMAGE_INPUTS))
    if extra:
        raise UsageError(f"settings {', '.join(extra)} have no field in an image request")
    if settings.get("seed") is None:
        raise UsageError("an image request needs a seed", hint="draw one with dif.noise.random_seed()")
    fields: dict[str, Any] = {k: settings.get(k) for k in REQUEST_SETTINGS}
    for key in ("sampler", "scheduler", "rng"):  # not set: the request's defaults
        if fields[key] is None:
            del fields[key]
    images = read_image_inputs(**inputs)
    return ImageRequest(prompt, negative_prompt, init_noise=init_noise, **fields, **images)


def read_image_inputs(
    *,
    ref_images: Sequence[Any] | None = None,
    init_image: Any = None,
    strength: float | None = None,
    mask: Any = None,
    batch: int | None = None,
    kv_cache: bool | None = None,
) -> dict[str, Any]:
    """The `IMAGE_INPUTS` fields of a request: every image decoded (`UsageError` naming the file), then
    `check_image_inputs`."""
    refs = tuple(read_image(r, what="reference image", index=i) for i, r in enumerate(ref_images or ()))
    source = None if init_image is None else read_image(init_image, what="init image")
    masked = None if mask is None else read_image(mask, what="mask")
    fields: dict[str, Any] = {
        "ref_images": refs, "init_image": source, "strength": strength, "mask": masked,
        "batch": 1 if batch is None else batch, "kv_cache": kv_cache,
    }  # fmt: skip
    check_image_inputs(**fields)
    return fields


def check_image_inputs(
    *,
    ref_images: Sequence[InputImage],
    init_image: InputImage | None,
    strength: float | None,
    mask: InputImage | None,
    batch: int,
    kv_cache: bool | None,
) -> None:
    """`UsageError` for inputs no model can run: a strength outside (0, 1] or without an init image, a
    mask without an init image or of another size, a batch outside 1..MAX_BATCH. What a model admits
    (how many reference images, img2img at all) its pipeline checks (`check_model_inputs`)."""
    if strength is not None:
        if init_image is None:
            raise UsageError("--strength needs an init image (-i / --init-image)")
        if not (isinstance(strength, int | float) and 0.0 < strength <= 1.0):
            raise UsageError(f"strength {strength} is outside (0, 1]", hint="1.0 repaints everything, 0.3 a little")
    if mask is not None:
        if init_image is None:
            raise UsageError(f"mask {mask.name} needs an init image (-i / --init-image) to inpaint")
        if mask.size != init_image.size:
            (mw, mh), (iw, ih) = mask.size, init_image.size
            raise UsageError(
                f"mask {mask.name} is {mw}x{mh} but init image {init_image.name} is {iw}x{ih}",
                hint="the mask must have the init image's size (white = repaint, black = keep)",
            )
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise UsageError(f"batch {batch} is outside 1..{MAX_BATCH}")
    if kv_cache and not ref_images:
        raise UsageError("--kv-cache caches the reference images' keys and values: give -r / --ref-image")


def batch_paths(path: Path, count: int) -> list[Path]:
    """The files a batch of `count` writes for `path`: `path` itself for one image; with "%d" in the
    file name, that replaced by 0, 1, ...; otherwise NAME-0.EXT, NAME-1.EXT, ..."""
    if "%d" in path.name:
        return [path.with_name(path.name.replace("%d", str(i))) for i in range(count)]
    if count == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{i}{path.suffix}") for i in range(count)]


def strength_schedule(schedule: FlowMatchSchedule, strength: float) -> FlowMatchSchedule:
    """The tail of `schedule` an img2img run at `strength` takes (diffusers' `get_timesteps`): the
    first int(n - min(n * strength, n)) steps are skipped. `UsageError` when none is left."""
    n = schedule.num_steps
    start = int(max(n - min(n * strength, n), 0))
    if start >= n:
        raise UsageError(f"strength {strength} leaves no step of {n}", hint="raise --strength or --steps")
    return evolve(schedule, sigmas=schedule.sigmas[start:], timesteps=schedule.timesteps[start:])


def _rounded(dtype: np.dtype) -> Callable[[Any], np.ndarray]:
    """x -> x rounded to `dtype` and back to float32: one torch operation in that dtype."""
    return lambda x: np.asarray(x, np.float32).astype(dtype).astype(np.float32)


def noised(image_latents: np.ndarray, noise: np.ndarray, sigma: np.float32, dtype: Any = np.float32) -> np.ndarray:
    """sigma * noise + (1 - sigma) * image latents in `dtype` (flow matching's forward process, as
    `FlowMatchEulerDiscreteScheduler.scale_noise` computes it: sigma cast to the latents' dtype, each
    operation rounded to it), broadcast over the batch axis."""
    r = _rounded(np.dtype(dtype))
    s = r(np.float32(sigma))
    x = r(r(s * r(noise)) + r(r(np.float32(1.0) - s) * r(image_latents)))
    return x.astype(dtype)


def inpaint_blend(latents: np.ndarray, source: np.ndarray, mask: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    """(1 - mask) * source + mask * latents, each operation rounded to `dtype` (mask 1 = repaint)."""
    r = _rounded(np.dtype(dtype))
    m = r(mask)
    return r(r(r(np.float32(1.0) - m) * r(source)) + r(m * r(latents))).astype(dtype)


@frozen(eq=False)
class ImageConditioning:
    """What the "encode" stage made of a request's images, in the run dtype. `context` is the frontend's
    own (FLUX.2: the reference tokens); `init_latents` (1, N, C) the img2img source's packed latents,
    `mask` (1, N, 1) float32 (1 = repaint) for inpainting."""

    context: Any = None
    init_latents: np.ndarray | None = None
    mask: np.ndarray | None = None


class TextToImagePipeline:
    """Base of a frontend's pipeline (an attrs class with a `dtype` field and its programs in a
    `dif.program_cache.ProgramCache` field `_programs`, made with the pipeline's `vram_budget` when it takes
    one). `grid_h`, `grid_w` count latent tokens. `cfg_base` is the model's CFG combine rule
    (`dif.sched.cfg_combine`); `on_step(done, total, latents)` is called after each step. `cfg_parallel`
    (set on the instance by `dif.kit.ranks`, `dif NAME generate --gpus 2`) makes this process one rank of a
    CFG-parallel pair (`dif.parallel.cfg`): `denoise` hands it to the sampling loop; a frontend that
    overrides `denoise` runs no CFG-parallel (`dif.kit.ranks` refuses it)."""

    cfg_base: ClassVar[Literal["uncond", "cond"]] = "uncond"
    cfg_parallel: CfgParallel | None = None
    dtype: DType
    on_step: StepCallback | None
    on_stage: Callable[[str, float], None] | None
    _programs: ProgramCache

    @property
    def pixels_per_token(self) -> int:
        """Image pixels per latent token along each side, from the checkpoint's configs (VAE scale
        factor x patch size)."""
        raise NotImplementedError

    @property
    def native_size(self) -> int:
        """The checkpoint's default width and height in pixels."""
        raise NotImplementedError

    def size(self, req: ImageRequest, /) -> tuple[int, int]:
        """(width, height) of `req`, the native size where it sets none."""
        return req.width or self.native_size, req.height or self.native_size

    @property
    def backend_name(self) -> str:
        """The backend that runs the programs ("interp" = the reference interpreter)."""
        return self._programs.backend_name

    @property
    def plan_peak_bytes(self) -> int:
        """The largest prepared plan's arena peak + parameter bytes (0 under "interp")."""
        return self._programs.plan_peak_bytes

    @property
    def load_seconds(self) -> float:
        """Time spent building, binding and preparing programs so far."""
        return self._programs.load_seconds

    @property
    def planned_budget(self) -> RuntimeBudget | None:
        """The pipeline's one budget on the latest program's backend (its free memory when the first
        program was planned, capped by `vram_budget`); None before any was planned, and under "interp"."""
        return self._programs.budget

    def memory_report(self) -> dict[str, Any]:
        """The memory budget, what the prepared programs stream, and the pipeline's residency decision
        (`ProgramCache.memory_report`)."""
        return self._programs.memory_report()

    def optimized_programs(self) -> dict[str, tuple[str, Any, tuple[Any, ...]]]:
        """By program name: (stage, optimized program, optimizer decisions) (`ProgramCache.optimized`)."""
        return self._programs.optimized()

    def resolve(self, req: Any, /) -> tuple[int, float, bool, list[str]]:
        """(steps, guidance, use_cfg, warnings) of the frontend's `ImageRequest` `req` under the
        checkpoint's defaults and rules."""
        raise NotImplementedError

    def fit_size(self, width: int, height: int, /) -> tuple[int, int, list[str]]:
        """(width, height, warnings): the size the model runs at for the one asked, a multiple of
        `pixels_per_token` (FLUX.2 rejects others with a `UsageError`, Krea 2 rounds them up)."""
        raise NotImplementedError

    def schedule(self, image_tokens: int, steps: int, /) -> FlowMatchSchedule:
        """The sigmas of a run at `image_tokens` latent tokens: the checkpoint's scheduler config
        with the model's shift rule."""
        raise NotImplementedError

    def initial_noise(self, req: Any, grid_h: int, grid_w: int, /) -> np.ndarray:
        """Packed initial latents in the run dtype, from `req`'s seed or its `init_noise`."""
        raise NotImplementedError

    def prepare_all(self, width: int, height: int, /, req: Any = None) -> None:
        """Build, bind and plan (inside `ProgramCache.planning`; prepare, outside it) every program for
        this (fitted) size and `req`'s batch and images, each with its stage (`ProgramCache.get(..., stage=)`)."""
        raise NotImplementedError

    max_reference_images: ClassVar[int] = 0
    """How many reference images (`ImageRequest.ref_images`) the model takes; 0: none."""
    takes_init_image: ClassVar[bool] = False
    """Whether the model runs img2img / inpainting from `ImageRequest.init_image`."""

    def check_model_inputs(self, req: ImageRequest, /) -> None:
        """`UsageError` for images this model does not take: more reference images than
        `max_reference_images`, an init image when it has no img2img. Called by the frontend's `resolve`."""
        limit, refs = self.max_reference_images, len(req.ref_images)
        if refs > limit:
            if limit == 0:
                raise UsageError("this model takes no reference images (-r / --ref-image)")
            raise UsageError(
                f"{refs} reference images given; this model takes at most {limit}",
                hint=f"reference image {limit + 1} is {req.ref_images[limit].name}",
            )
        if req.init_image is not None and not self.takes_init_image:
            raise UsageError("this model has no img2img / inpainting (-i / --init-image)")

    def uses_kv_cache(self, req: Any, /) -> bool:
        """Whether `req` computes its reference images' keys/values once (`ImageRequest.kv_cache`)."""
        return False

    def encode_images(self, req: Any, grid_h: int, grid_w: int, /) -> ImageConditioning | None:
        """The request's images through the model's image encoder (the "encode" stage); None when it has none."""
        if req.ref_images or req.init_image is not None:
            raise NotImplementedError
        return None

    def run_keys(self) -> dict[str, Any]:
        """The run's "model" name and the frontend's own settings keys (variant, layout, ...)."""
        raise NotImplementedError

    def generate(self, req: Any, /) -> ImageRun:
        """The one image of `req` (`generate_batch`; `UsageError` for a request of more)."""
        runs = self.generate_batch(req)
        if len(runs) != 1:
            raise UsageError(f"the request makes {len(runs)} images", hint="call generate_batch")
        return runs[0]

    def generate_batch(self, req: Any, /) -> list[ImageRun]:
        """The whole run for the frontend's `ImageRequest` `req`, one `ImageRun` per image of its batch:
        the "load" stage (schedule and the caller's noise, cheap checks first, then the programs: all
        planned, then the pipeline's one memory budget decides what is resident when, `dif.plan.pipeline`;
        prepared now when all fit together, else by each stage as it starts; then the seeded noise), then
        `run_batch`. With an init image the schedule is the tail `strength_schedule` leaves."""
        width, height, _ = self.fit_size(*self.size(req))
        grid = (height // self.pixels_per_token, width // self.pixels_per_token)
        steps, guidance, cfg, warnings = self.resolve(req)
        timer = StageTimer(self.on_stage)
        with timer.stage("load"):
            self.prefetch_prompts([req.prompt, req.negative_prompt] if cfg else [req.prompt])
            schedule = with_sampling(
                self.schedule(grid[0] * grid[1], steps), sampler=req.sampler, scheduler=req.scheduler
            )
            if req.init_image is not None:
                schedule = strength_schedule(schedule, 1.0 if req.strength is None else req.strength)
            # the caller's noise is checked before anything loads; seeded noise is drawn once the plans have
            # admitted the size (a size too large for the device is refused before gigabytes of noise are drawn)
            noise = self.initial_noise(req, *grid) if req.init_noise is not None else None
            with self._programs.planning():  # plans all, decides what is resident when, prepares what fits
                self.prepare_all(width, height, req)
            if noise is None:
                noise = self.initial_noise(req, *grid)
        return self.run_batch(
            req,
            timer,
            noise=noise,
            schedule=schedule,
            guidance=guidance,
            cfg=cfg,
            size=(width, height),
            grid=grid,
            warnings=warnings,
            full_steps=steps,
            **self.run_keys(),
            **({"fp8_weights": dict(self._programs.fp8_weights)} if self._programs.fp8_weights else {}),
            **({"q4_0_weights": dict(self._programs.int4_weights)} if self._programs.int4_weights else {}),
        )

    def prefetch_prompts(self, prompts: Sequence[str], /) -> None:
        """Start the part of encoding `prompts` that can run beside the load (tokenizing them in a child
        process, `TextTokenizer.prefetch`); called as the load stage begins. The default starts nothing."""

    def encode(self, prompt: str, /) -> Any:
        """The text conditioning of `prompt`, in whatever form `denoise` takes it."""
        raise NotImplementedError

    def predictor(self, grid_h: int, grid_w: int, /, images: ImageConditioning | None = None) -> Predict:
        """The per-step model call at this latent grid: (latents (B, N, C), timestep, conditioning from
        `encode`) -> velocity (B, N, C), all in the run dtype; `images` from `encode_images`."""
        raise NotImplementedError

    def denoise(
        self,
        noise: np.ndarray,
        cond: Any,
        uncond: Any,
        schedule: FlowMatchSchedule,
        guidance: float,
        grid_h: int,
        grid_w: int,
        /,
        images: ImageConditioning | None = None,
    ) -> np.ndarray:
        """Packed latents (B, N, C) after `schedule` from packed `noise` (B, N, C) (the kit's loop over
        `predictor`); CFG with `guidance` and the model's `cfg_base` when `uncond` is given. With
        `images.init_latents` (img2img) the loop starts from them noised to the schedule's first sigma;
        with `images.mask` each step's latents keep the source, noised to the next sigma, where the mask
        is 0 (diffusers' inpainting blend)."""
        predict = self.predictor(grid_h, grid_w) if images is None else self.predictor(grid_h, grid_w, images)
        x = noise.astype(self.dtype.np)
        init = None if images is None else images.init_latents
        if init is not None:
            x = noised(init, noise, schedule.sigmas[0], self.dtype.np)

        def run(x: np.ndarray, part: FlowMatchSchedule, on_step: StepCallback | None) -> np.ndarray:
            return sample(
                x, part, predict, cond, uncond=uncond, guidance=guidance, cfg_base=self.cfg_base, on_step=on_step,
                cfg_parallel=self.cfg_parallel,
            )  # fmt: skip

        if init is None or images is None or images.mask is None:
            return run(x, schedule, self.on_step)
        mask, dt = images.mask, self.dtype.np
        total = schedule.num_steps
        for i in range(total):  # one step at a time: the blend follows each step
            step = evolve(schedule, sigmas=schedule.sigmas[i : i + 2], timesteps=schedule.timesteps[i : i + 1])
            x = run(x, step, None)
            source = noised(init, noise, schedule.sigmas[i + 1], dt) if i < total - 1 else init
            x = inpaint_blend(x, source, mask, dt)
            if self.on_step is not None:
                self.on_step(i + 1, total, x)
        return x

    def decode(self, latents: np.ndarray, grid_h: int, grid_w: int, /) -> np.ndarray:
        """(H, W, 3) uint8 pixels from packed latents."""
        raise NotImplementedError

    def enter_stage(self, timer: StageTimer, stage: str) -> None:
        """Before `stage` runs: release the programs the pipeline's memory decision does not keep during
        it and prepare its own (`ProgramCache.enter`), timed as stage "load.STAGE" when that did anything
        (so the stage's own time, and the denoising rate, cover its work only); then tell the progress
        listener the stage begins."""
        start = time.perf_counter()
        if self._programs.enter(stage):
            timer.record(f"load.{stage}", time.perf_counter() - start)
        stage_starting(stage)

    def run_stages(self, req: ImageRequest, timer: StageTimer, **kwargs: Any) -> ImageRun:
        """`run_batch` of a one-image request: its one run."""
        runs = self.run_batch(req, timer, **kwargs)
        if len(runs) != 1:
            raise UsageError(f"the request makes {len(runs)} images", hint="call run_batch")
        return runs[0]

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
        """(packed final latents (B, N, C), one (H, W, 3) uint8 picture per image): stages "encode" (the
        prompt, the negative prompt when `cfg`, the request's images), "denoise" (all images of the batch
        at once) and "decode" (one image at a time) on `timer`. A frontend that can run several stages as
        one program overrides this."""
        self.enter_stage(timer, "encode")
        with timer.stage("encode"):
            cond = self.encode(req.prompt)
            uncond = self.encode(req.negative_prompt) if cfg else None
            images = self.encode_images(req, *grid)
        self.enter_stage(timer, "denoise")
        with timer.stage("denoise"):
            if images is None:
                latents = self.denoise(noise, cond, uncond, schedule, guidance, *grid)
            else:
                latents = self.denoise(noise, cond, uncond, schedule, guidance, *grid, images)
        self.enter_stage(timer, "decode")
        with timer.stage("decode"):
            pixels = [self.decode(latents[i : i + 1], *grid) for i in range(latents.shape[0])]
        return latents, pixels

    def run_batch(
        self,
        req: ImageRequest,
        timer: StageTimer,
        *,
        noise: np.ndarray,
        schedule: FlowMatchSchedule,
        guidance: float,
        cfg: bool,
        size: tuple[int, int],
        grid: tuple[int, int],
        warnings: Sequence[str],
        model: str,
        full_steps: int | None = None,
        **extra: Any,
    ) -> list[ImageRun]:
        """`render`'s stages on `timer`, then one run per image: settings by `dif.report.image_settings`
        (`size` = (width, height) in pixels, steps and mu from `schedule`, image i's seed `req.seed + i`,
        `extra` = the frontend's own keys, in order, then the images read; "steps" is `full_steps`, the
        count before an img2img strength cut, when given), the timings, `warnings`, peak memory. `noise` is
        the packed initial latents (B, N, C) in the run dtype."""
        latents, pixels = self.render(req, timer, noise=noise, schedule=schedule, guidance=guidance, cfg=cfg, grid=grid)
        inputs: dict[str, Any] = {}
        if req.ref_images:
            inputs["reference_images"] = [r.name for r in req.ref_images]
            inputs["kv_cache"] = self.uses_kv_cache(req)
        if req.init_image is not None:
            inputs["init_image"] = req.init_image.name
            inputs["strength"] = 1.0 if req.strength is None else req.strength
            inputs["denoised_steps"] = schedule.num_steps
        if req.mask is not None:
            inputs["mask"] = req.mask.name
        runs = []
        for i, image in enumerate(pixels):
            settings = image_settings(
                prompt=req.prompt,
                negative_prompt=req.negative_prompt,
                steps=schedule.num_steps if full_steps is None else full_steps,
                guidance=guidance,
                cfg=cfg,
                seed=req.seed + i,
                init_noise=req.init_noise is not None,
                width=size[0],
                height=size[1],
                dtype=self.dtype.value,
                mu=schedule.mu,
                model=model,
                backend=self.backend_name,
                sampler=schedule.sampler,
                scheduler=schedule.scheduler,
                rng=req.rng,
                **extra,
                **inputs,
                **({"batch_size": len(pixels), "batch_index": i} if len(pixels) > 1 else {}),
                **({"parallel": self.cfg_parallel.record()} if self.cfg_parallel is not None else {}),
            )
            row = slice(i, i + 1)
            runs.append(
                ImageRun(
                    image,
                    latents[row],
                    noise[row],
                    settings,
                    timer.timings,
                    tuple(warnings),
                    peak_rss_bytes(),
                    self.plan_peak_bytes,
                )  # fmt: skip
            )
        return runs
