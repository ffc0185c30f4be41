"""The sampling loop every flow-match frontend runs: Euler steps over a `FlowMatchSchedule`, with
classifier-free guidance by the model's combine rule, written once.

Where it sits: inside a pipeline's "denoise" stage (`dif.image_pipeline.TextToImagePipeline.denoise`).
The frontend supplies only `predict(latents, timestep, conditioning) -> velocity`, the per-step
model call; the loop owns the order of operations, so every frontend rounds alike (diffusers').
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from dif.kit.finite import require_finite
from dif.sched import FlowMatchSchedule, cfg_combine, euler_step

Predict = Callable[[np.ndarray, float, Any], np.ndarray]
"""(latents (1, N, C) in the run dtype, timestep (a numpy float32 scalar, 1000 * sigma; pass it on
as it is), conditioning) -> velocity."""

StepCallback = Callable[[int, int, np.ndarray], None]
"""(steps done, total steps, latents after that step): progress bars, previews."""


def sample(
    latents: np.ndarray,
    schedule: FlowMatchSchedule,
    predict: Predict,
    cond: Any,
    *,
    uncond: Any = None,
    guidance: float = 1.0,
    cfg_base: Literal["uncond", "cond"] = "uncond",
    on_step: StepCallback | None = None,
) -> np.ndarray:
    """`latents` after every step of `schedule`: v = predict(x, t, cond); with `uncond` (CFG on)
    v = cfg_combine(v, predict(x, t, uncond), guidance, base=cfg_base); x = euler_step(x, v, dt).
    The result keeps the dtype of `latents`. `on_step(i, n, x)` is called after each step. Under
    the run's finite checks (`dif.kit.finite`) the initial latents, each step's velocity and the
    latents after it must be finite (`NonFiniteError` naming the step)."""
    x = require_finite("initial latents", latents)
    total = schedule.num_steps
    for i, t in enumerate(schedule.timesteps):
        velocity = require_finite("denoiser output", predict(x, t, cond), step=(i + 1, total))
        if uncond is not None:
            unguided = require_finite("denoiser output (negative prompt)", predict(x, t, uncond), step=(i + 1, total))
            velocity = cfg_combine(velocity, unguided, guidance, base=cfg_base)
        x = require_finite("latents", euler_step(x, velocity, schedule.dt(i)), step=(i + 1, total))
        if on_step is not None:
            on_step(i + 1, total, x)
    return x
