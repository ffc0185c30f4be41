"""What every text-to-image pipeline shares around its model: the request, the timed encode ->
denoise -> decode stages after its "load" stage, and the `dif.report.ImageRun` they end in.

Where it sits: a frontend's pipeline (FLUX.2's, Krea 2's) subclasses `TextToImagePipeline` and
implements the model-specific work: `fit_size`, `resolve`, `schedule`, `initial_noise`,
`prepare_all`, `encode` / `predictor` / `decode`, `run_keys`. `denoise` is the kit's one sampling
loop (`dif.kit.sampling.sample`) and `generate` the one order of a run: resolve the request (size,
steps, guidance, CFG), draw the noise, make the schedule and prepare the programs in its "load"
stage, then `run_stages`. The CLI (`dif.kit.commands`) and the Python API (`dif.load`) build
the request with `image_request` from the frontend's settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from attrs import frozen

from dif.dtypes import DType
from dif.errors import UsageError
from dif.kit.sampling import Predict, StepCallback, sample
from dif.program_cache import ProgramCache
from dif.progress import stage_starting
from dif.report import ImageRun, image_settings
from dif.runstats import StageTimer, peak_rss_bytes
from dif.sched import FlowMatchSchedule
from dif.target import RuntimeBudget


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


REQUEST_SETTINGS = ("steps", "guidance", "seed", "width", "height")
"""The `ImageRequest` fields a frontend's settings (`dif.frontend.SettingSpec`) fill."""


def image_request(
    prompt: str, settings: Mapping[str, Any], *, negative_prompt: str = "", init_noise: np.ndarray | None = None
) -> ImageRequest:
    """The request of resolved `settings` (`FrontendInfo.resolve_settings`; a seed must be set);
    `UsageError` naming a setting the request has no field for."""
    extra = sorted(set(settings) - set(REQUEST_SETTINGS))
    if extra:
        raise UsageError(f"settings {', '.join(extra)} have no field in an image request")
    if settings.get("seed") is None:
        raise UsageError("an image request needs a seed", hint="draw one with dif.noise.random_seed()")
    fields: dict[str, Any] = {k: settings.get(k) for k in REQUEST_SETTINGS}
    return ImageRequest(prompt, negative_prompt, init_noise=init_noise, **fields)


class TextToImagePipeline:
    """Base of a frontend's pipeline (an attrs class with a `dtype` field and its programs in a
    `dif.program_cache.ProgramCache` field `_programs`, made with the pipeline's `vram_budget` when it takes
    one). `grid_h`, `grid_w` count latent tokens. `cfg_base` is the model's CFG combine rule
    (`dif.sched.cfg_combine`); `on_step(done, total, latents)` is called after each step."""

    cfg_base: ClassVar[Literal["uncond", "cond"]] = "uncond"
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

    def prepare_all(self, width: int, height: int, /) -> None:
        """Build, bind and plan (inside `ProgramCache.planning`; prepare, outside it) every program for
        this (fitted) size, each with its stage (`ProgramCache.get(..., stage=)`)."""
        raise NotImplementedError

    def run_keys(self) -> dict[str, Any]:
        """The run's "model" name and the frontend's own settings keys (variant, layout, ...)."""
        raise NotImplementedError

    def generate(self, req: Any, /) -> ImageRun:
        """The whole run for the frontend's `ImageRequest` `req`: the "load" stage (schedule and the
        caller's noise, cheap checks first, then the programs: all planned, then the pipeline's one memory
        budget decides what is resident when, `dif.plan.pipeline`; prepared now when all fit together,
        else by each stage as it starts; then the seeded noise), then `run_stages`."""
        width, height, _ = self.fit_size(*self.size(req))
        grid = (height // self.pixels_per_token, width // self.pixels_per_token)
        steps, guidance, cfg, warnings = self.resolve(req)
        timer = StageTimer(self.on_stage)
        with timer.stage("load"):
            schedule = self.schedule(grid[0] * grid[1], steps)
            # the caller's noise is checked before anything loads; seeded noise is drawn once the plans have
            # admitted the size (a size too large for the device is refused before gigabytes of noise are drawn)
            noise = self.initial_noise(req, *grid) if req.init_noise is not None else None
            with self._programs.planning():  # plans all, decides what is resident when, prepares what fits
                self.prepare_all(width, height)
            if noise is None:
                noise = self.initial_noise(req, *grid)
        return self.run_stages(
            req,
            timer,
            noise=noise,
            schedule=schedule,
            guidance=guidance,
            cfg=cfg,
            size=(width, height),
            grid=grid,
            warnings=warnings,
            **self.run_keys(),
        )

    def encode(self, prompt: str, /) -> Any:
        """The text conditioning of `prompt`, in whatever form `denoise` takes it."""
        raise NotImplementedError

    def predictor(self, grid_h: int, grid_w: int, /) -> Predict:
        """The per-step model call at this latent grid: (latents, timestep, conditioning from
        `encode`) -> velocity, all in the run dtype."""
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
    ) -> np.ndarray:
        """Packed latents after `schedule` from packed `noise` (the kit's loop over `predictor`);
        CFG with `guidance` and the model's `cfg_base` when `uncond` is given."""
        return sample(
            noise.astype(self.dtype.np),
            schedule,
            self.predictor(grid_h, grid_w),
            cond,
            uncond=uncond,
            guidance=guidance,
            cfg_base=self.cfg_base,
            on_step=self.on_step,
        )

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

    def run_stages(
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
        **extra: Any,
    ) -> ImageRun:
        """Stages "encode" (the prompt, and the negative prompt when `cfg`), "denoise" and "decode" on
        `timer`, then the run: settings by `dif.report.image_settings` (`size` = (width, height) in
        pixels, steps and mu from `schedule`, `extra` = the frontend's own keys, in order), the
        timings, `warnings`, peak memory. `noise` is the packed initial latents in the run dtype."""
        self.enter_stage(timer, "encode")
        with timer.stage("encode"):
            cond = self.encode(req.prompt)
            uncond = self.encode(req.negative_prompt) if cfg else None
        self.enter_stage(timer, "denoise")
        with timer.stage("denoise"):
            latents = self.denoise(noise, cond, uncond, schedule, guidance, *grid)
        self.enter_stage(timer, "decode")
        with timer.stage("decode"):
            pixels = self.decode(latents, *grid)
        settings = image_settings(
            prompt=req.prompt,
            negative_prompt=req.negative_prompt,
            steps=schedule.num_steps,
            guidance=guidance,
            cfg=cfg,
            seed=req.seed,
            init_noise=req.init_noise is not None,
            width=size[0],
            height=size[1],
            dtype=self.dtype.value,
            mu=schedule.mu,
            model=model,
            backend=self.backend_name,
            **extra,
        )
        return ImageRun(
            pixels, latents, noise, settings, timer.timings, tuple(warnings), peak_rss_bytes(), self.plan_peak_bytes
        )
