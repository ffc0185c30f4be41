"""The sampling loop every flow-match frontend runs: Euler, Heun or DPM++ 2M steps over a
`FlowMatchSchedule`, with classifier-free guidance by the model's combine rule, written once.

Where it sits: inside a pipeline's "denoise" stage (`dif.image_pipeline.TextToImagePipeline.denoise`).
The frontend supplies only `predict(latents, timestep, conditioning) -> velocity`, the per-step
model call; the loop owns the order of operations, so every frontend rounds alike (diffusers').
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from dif.errors import UsageError
from dif.kit.finite import require_finite
from dif.sched import SAMPLERS, FlowMatchSchedule, cfg_combine, euler_step
from dif.sched.solvers import dpm_x0, dpmpp_2m_step, heun_derivative, heun_predict

if TYPE_CHECKING:
    from dif.parallel.cfg import CfgParallel

Predict = Callable[[np.ndarray, float, Any], np.ndarray]
"""(latents (1, N, C) in the run dtype, timestep (a numpy float32 scalar, 1000 * sigma; pass it on
as it is), conditioning) -> velocity."""

StepCallback = Callable[[int, int, np.ndarray], None]
"""(steps done, total steps, latents after that step): progress bars, previews."""


def step_invariant(arr: np.ndarray) -> np.ndarray:
    """`arr` made read-only, for a `Predict` to pass the same object as a model input at every step (text
    features, RoPE tables, masks): a backend may then keep it staged instead of copying it again each step
    (the CUDA executor does). `arr` must own its memory or view a read-only array, else it is still copied."""
    arr.flags.writeable = False
    return arr


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
    cfg_parallel: CfgParallel | None = None,
) -> np.ndarray:
    """`latents` after every step of `schedule`, stepped by `schedule.sampler`: v = predict(x, t, cond);
    with `uncond` (CFG on) v = cfg_combine(v, predict(x, t, uncond), guidance, base=cfg_base); then
    "euler": x = euler_step(x, v, dt); "heun": an Euler predictor to sigma_{i+1}, a second model call
    there and the averaged derivative from x (the last step, to sigma 0, is Euler's); "dpm++2m":
    DPM-Solver++(2M) on the data predictions x - sigma * v (`dif.sched.solvers`). The result keeps the
    dtype of `latents`. `on_step(i, n, x)` is called after each step. Under the run's finite checks
    (`dif.kit.finite`) the initial latents, each model output and the latents after each step must be
    finite (`NonFiniteError` naming the step).

    With `cfg_parallel` (`dif.parallel.cfg`, CFG on) this process is one rank of two: it runs only its
    branch's model call (cond on rank 0, uncond on rank 1), all-gathers the two velocities and combines them
    as above, so every rank steps the same latents, equal to one process's."""
    x = require_finite("initial latents", latents)
    total = schedule.num_steps
    if cfg_parallel is not None and uncond is None:
        raise UsageError("CFG-parallel sampling needs the uncond conditioning (CFG is off)")

    def velocity(x: np.ndarray, t: Any, step: int) -> np.ndarray:  # t: a float32 scalar of the schedule
        where = (step + 1, total)
        if cfg_parallel is not None:  # this rank's branch, then both ranks' outputs, checked as one process does
            mine = predict(x, t, cond if cfg_parallel.branch == "cond" else uncond)
            guided, unguided = cfg_parallel.comm.all_gather(mine)
            v = require_finite("denoiser output", guided, step=where)
            unguided = require_finite("denoiser output (negative prompt)", unguided, step=where)
            return cfg_combine(v, unguided, guidance, base=cfg_base)
        v = require_finite("denoiser output", predict(x, t, cond), step=where)
        if uncond is not None:
            unguided = require_finite("denoiser output (negative prompt)", predict(x, t, uncond), step=where)
            v = cfg_combine(v, unguided, guidance, base=cfg_base)
        return v

    sigmas, timesteps = schedule.sigmas, schedule.timesteps
    if schedule.sampler not in SAMPLERS:
        raise UsageError(f"unknown sampling method '{schedule.sampler}'", hint=f"use one of {', '.join(SAMPLERS)}")
    prev_x0: np.ndarray | None = None
    for i, t in enumerate(timesteps):
        v = velocity(x, t, i)
        if schedule.sampler == "euler":
            x = euler_step(x, v, schedule.dt(i))
        elif schedule.sampler == "heun":
            d = heun_derivative(x, v, sigmas[i])
            if i + 1 < total:  # Heun's corrector: a second model call at the predicted point
                guess = heun_predict(x, d, schedule.dt(i), x.dtype)
                d2 = heun_derivative(guess, velocity(guess, timesteps[i + 1], i), sigmas[i + 1])
                d = d.dtype.type(0.5) * (d + d2)
            x = heun_predict(x, d, schedule.dt(i), x.dtype)
        else:
            x0 = dpm_x0(x, v, sigmas[i])
            x = dpmpp_2m_step(x, x0, prev_x0, sigmas, i, x.dtype)
            prev_x0 = x0
        x = require_finite("latents", x, step=(i + 1, total))
        if on_step is not None:
            on_step(i + 1, total, x)
    return x
