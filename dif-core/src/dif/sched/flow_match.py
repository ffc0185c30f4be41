"""Sampling schedules, flow matching: sigmas, resolution-dependent time shift, and the Euler step.

Where it sits: a frontend's host-side sampling loop asks `flow_match_schedule` for sigmas and
timesteps, runs the denoiser program on the device, and advances latents with `euler_step`.
The arithmetic follows diffusers' `FlowMatchEulerDiscreteScheduler` in float32 operation by
operation (same rounding), so an fp32 run reproduces a diffusers run from the same noise; the
comments say where a detail matters.

Conventions: sigma runs from 1 (pure noise) to 0 (clean); the model predicts the velocity
v = noise - x0, and x_{i+1} = x_i + (sigma_{i+1} - sigma_i) * v.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from attrs import frozen

from dif.errors import DifError, UsageError
from dif.sched.sigmas import respace_sigmas
from dif.sched.solvers import SAMPLERS

F32 = np.float32
F32_MAX = float(np.finfo(F32).max)


def linear_sigmas(num_steps: int) -> np.ndarray:
    """`num_steps` sigmas evenly spaced from 1 down to 1/num_steps (float64 linspace, then float32),
    the default grid of the FLUX.2 pipelines. Shape (num_steps,)."""
    if num_steps < 1:
        raise DifError(f"number of steps must be at least 1, got {num_steps}")
    return np.linspace(1.0, 1.0 / num_steps, num_steps).astype(F32)


def time_shift_exponential(sigmas: np.ndarray, mu: float, exponent: float = 1.0) -> np.ndarray:
    """sigma' = e^mu / (e^mu + (1/sigma - 1)^exponent), computed in float32 like diffusers
    (numpy float32 arrays with Python scalars: each scalar is rounded to float32 first)."""
    try:
        k = math.exp(mu)
    except OverflowError:
        k = math.inf
    if not k <= F32_MAX:  # in float32 (as diffusers computes it) e^mu would be inf and the sigmas NaN
        raise DifError(f"time shift mu={mu} is out of range (e^mu overflows float32)")
    return _time_shift(sigmas, F32(k), exponent)


def time_shift_linear(sigmas: np.ndarray, mu: float, exponent: float = 1.0) -> np.ndarray:
    """sigma' = mu / (mu + (1/sigma - 1)^exponent), float32."""
    return _time_shift(sigmas, F32(mu), exponent)


def _time_shift(sigmas: np.ndarray, k: np.float32, exponent: float) -> np.ndarray:
    """sigma' = k / (k + (1/sigma - 1)^exponent) in float32 (sigma 0 gives 0)."""
    s = np.asarray(sigmas, dtype=F32)
    with np.errstate(divide="ignore"):
        odds = (F32(1.0) / s - F32(1.0)) ** F32(exponent)
    return (k / (k + odds)).astype(F32)


def shift_static(sigmas: np.ndarray, shift: float) -> np.ndarray:
    """sigma' = s*sigma / (1 + (s-1)*sigma), the fixed shift used without dynamic shifting."""
    s = np.asarray(sigmas, dtype=F32)
    k = F32(shift)
    return (k * s / (F32(1.0) + (k - F32(1.0)) * s)).astype(F32)


@frozen(eq=False)
class FlowMatchSchedule:
    """sigmas: (n+1,) float32 ending in the terminal 0; timesteps: (n,) float32 = 1000*sigma.
    `sampler` (`dif.sched.solvers.SAMPLERS`) and `scheduler` (`dif.sched.sigmas.SCHEDULERS`) say how
    the loop steps through them and how they were spaced (`with_sampling`)."""

    sigmas: np.ndarray
    timesteps: np.ndarray
    mu: float | None = None
    sampler: str = "euler"
    scheduler: str = "simple"
    num_train_timesteps: int = 1000

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    def dt(self, i: int) -> np.float32:
        """sigma_{i+1} - sigma_i in float32 (negative); pass it to `euler_step` as it is."""
        return F32(self.sigmas[i + 1] - self.sigmas[i])


def flow_match_schedule(
    num_steps: int | None = None,
    *,
    sigmas: np.ndarray | None = None,
    mu: float | None = None,
    shift: float = 1.0,
    shift_type: str = "exponential",
    num_train_timesteps: int = 1000,
) -> FlowMatchSchedule:
    """The schedule for a run.

    Given `mu`, the resolution-dependent shift of type `shift_type` ("exponential" | "linear") is
    applied (diffusers' `use_dynamic_shifting=True`); otherwise the static `shift`. `sigmas`
    defaults to `linear_sigmas(num_steps)`.
    """
    if sigmas is None:
        if num_steps is None:
            raise DifError("flow_match_schedule needs num_steps or sigmas")
        sigmas = linear_sigmas(num_steps)
    base = np.asarray(sigmas, dtype=F32)
    if mu is not None:
        if shift_type == "exponential":
            shifted = time_shift_exponential(base, mu)
        elif shift_type == "linear":
            shifted = time_shift_linear(base, mu)
        else:
            raise DifError(f"unknown time shift type '{shift_type}'", hint="use 'exponential' or 'linear'")
    else:
        shifted = shift_static(base, shift)
    timesteps = (shifted * F32(num_train_timesteps)).astype(F32)
    full = np.concatenate([shifted, np.zeros(1, F32)]).astype(F32)
    return FlowMatchSchedule(full, timesteps, mu, num_train_timesteps=num_train_timesteps)


def with_sampling(
    schedule: FlowMatchSchedule, *, sampler: str = "euler", scheduler: str = "simple"
) -> FlowMatchSchedule:
    """`schedule` (the model's own, "simple") with its sigmas respaced by `scheduler`
    (`dif.sched.sigmas.respace_sigmas`; the timesteps follow: sigma * num_train_timesteps in float32)
    and stepped by `sampler`. `UsageError` naming the option for an unknown name."""
    if sampler not in SAMPLERS:
        raise UsageError(f"unknown sampling method '{sampler}'", hint=f"--sampling-method takes {', '.join(SAMPLERS)}")
    if schedule.scheduler != "simple":
        raise DifError(f"the schedule is already respaced ({schedule.scheduler})")
    sigmas = respace_sigmas(schedule.sigmas[:-1], scheduler)
    timesteps = schedule.timesteps if scheduler == "simple" else (sigmas * F32(schedule.num_train_timesteps))
    full = np.concatenate([sigmas, np.zeros(1, F32)]).astype(F32)
    return FlowMatchSchedule(full, timesteps.astype(F32), schedule.mu, sampler, scheduler, schedule.num_train_timesteps)


def euler_step(sample: np.ndarray, velocity: np.ndarray, dt: float | np.float32) -> np.ndarray:
    """x + dt * v, returned in the velocity's dtype (diffusers casts the result back each step).

    dt is taken as float32: a `FlowMatchSchedule.dt` already is one; a Python float is rounded.

    float32 velocity: all float32. bf16 velocity: like torch, dt is rounded to bf16 (a 0-d
    tensor adopts the other operand's dtype), dt*v is rounded to bf16, the sum is taken in float32
    with the float32-upcast sample, and the result is rounded to bf16 (pitfall: latents live in bf16).
    """
    v = np.asarray(velocity)
    x32 = np.asarray(sample, dtype=F32)
    if v.dtype == F32:
        return (x32 + F32(dt) * v).astype(F32)
    lo = v.dtype
    d = np.asarray(F32(dt)).astype(lo)
    prod = (d.astype(F32) * v.astype(F32)).astype(lo)
    return (x32 + prod.astype(F32)).astype(lo)


def cfg_combine(
    cond: np.ndarray, uncond: np.ndarray, scale: float, *, base: Literal["uncond", "cond"] = "uncond"
) -> np.ndarray:
    """Classifier-free guidance, each operation rounded to the inputs' dtype as torch does.

    base="uncond": uncond + scale * (cond - uncond) (FLUX.2 and most pipelines; scale 1 is cond);
    base="cond":   cond + scale * (cond - uncond) (Krea 2; scale 0 is cond)."""
    lo = np.asarray(cond).dtype
    if base == "uncond":
        start = uncond
    elif base == "cond":
        start = cond
    else:
        raise DifError(f"unknown CFG base '{base}'", hint="use 'uncond' or 'cond'")
    if lo == F32:
        return (start + F32(scale) * (cond - uncond)).astype(F32)
    diff = (cond.astype(F32) - uncond.astype(F32)).astype(lo)
    scaled = (F32(scale) * diff.astype(F32)).astype(lo)
    return (start.astype(F32) + scaled.astype(F32)).astype(lo)
