"""The discrete (DDPM-trained, epsilon-prediction) schedule and its Euler step, as diffusers'
EulerDiscreteScheduler computes them; host-side numpy.

Where it sits: the pipeline's "denoise" stage (`SdPipeline.denoise`). SD-Turbo at 1 step:
timestep 999, sigma = sqrt((1 - acp) / acp) = 14.6146 at t = 999, x_T = randn * sigma (trailing
spacing: the noise scale is sigma_max itself), model input x / sqrt(sigma^2 + 1), x0 = x - sigma * eps.
EulerAncestral equals Euler at one step (sigma_up = 0 when the next sigma is 0).
The returned `FlowMatchSchedule` is the kit's container: VE sigmas (n + 1, ending in 0) and the
discrete timesteps (n) the UNet is fed.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from dif.errors import UsageError
from dif.sched import FlowMatchSchedule
from dif_frontend_sdturbo.config import SchedulerConfig

F32 = np.float32


def alphas_cumprod(cfg: SchedulerConfig) -> np.ndarray:
    """(num_train_timesteps,) float32 cumulative products of 1 - beta, from the config's betas
    (scaled_linear: linspace of sqrt(beta) squared), rounded as torch computes them."""
    n = cfg.num_train_timesteps
    if cfg.beta_schedule == "scaled_linear":
        betas = (torch_linspace(cfg.beta_start**0.5, cfg.beta_end**0.5, n) ** 2).astype(F32)
    else:
        betas = torch_linspace(cfg.beta_start, cfg.beta_end, n)
    # torch's CPU cumprod accumulates float32 in double: a float32 running product drifts by ulps
    return np.cumprod((F32(1.0) - betas).astype(F32).astype(np.float64)).astype(F32)


def torch_linspace(start: float, end: float, n: int) -> np.ndarray:
    """(n,) float32 as torch.linspace(dtype=float32) gives them: a float32 step, the first half counted
    up from `start`, the second half down from `end` (numpy's linspace differs in the last ulp)."""
    a, b = F32(start), F32(end)
    step = F32((b - a) / F32(max(n - 1, 1)))
    i = np.arange(n, dtype=np.float64)
    up = np.float64(a) + np.float64(step) * i
    down = np.float64(b) - np.float64(step) * (n - 1 - i)
    return np.where(i < n // 2, up, down).astype(F32)


def discrete_timesteps(cfg: SchedulerConfig, steps: int) -> np.ndarray:
    """(steps,) float32 timesteps by the config's spacing, as EulerDiscreteScheduler.set_timesteps."""
    n = cfg.num_train_timesteps
    if steps < 1 or steps > n:
        raise UsageError(f"steps {steps} must be in 1..{n} (the training timesteps)")
    if cfg.timestep_spacing == "linspace":
        t = np.linspace(0, n - 1, steps, dtype=np.float64)[::-1]
    elif cfg.timestep_spacing == "leading":
        ratio = n // steps
        t = (np.arange(0, steps) * ratio).round()[::-1].astype(np.float64) + cfg.steps_offset
    else:  # trailing
        t = np.round(np.arange(n, 0, -n / steps)).astype(np.float64) - 1
    return t.astype(F32)


@cache
def _sigma_table(cfg: SchedulerConfig) -> np.ndarray:
    """(num_train_timesteps,) float32 sqrt((1 - acp) / acp), read-only: a request asks for its schedule
    three times (resolve, admission, the loop), and the table costs ~0.1 ms of a 12 ms SD-Turbo image."""
    acp = alphas_cumprod(cfg)
    table = (((F32(1.0) - acp) / acp) ** F32(0.5)).astype(F32)
    table.setflags(write=False)
    return table


def discrete_schedule(cfg: SchedulerConfig, steps: int) -> FlowMatchSchedule:
    """Sigmas (steps + 1,) float32 (interpolated linearly in t on sqrt((1 - acp) / acp), then 0) and
    the timesteps (steps,) float32."""
    table = _sigma_table(cfg)
    t = discrete_timesteps(cfg, steps)
    sigmas = np.interp(t.astype(np.float64), np.arange(len(table)), table.astype(np.float64))
    full = np.concatenate([sigmas, [0.0]]).astype(F32)
    return FlowMatchSchedule(full, t, None, num_train_timesteps=cfg.num_train_timesteps)


def init_noise_sigma(cfg: SchedulerConfig, schedule: FlowMatchSchedule) -> np.float32:
    """The factor the pipeline multiplies the unit noise by: sigma_max for linspace / trailing
    spacing, else sqrt(sigma_max^2 + 1) (diffusers' rule)."""
    top = F32(schedule.sigmas.max())
    if cfg.timestep_spacing in ("linspace", "trailing"):
        return top
    return F32((top**2 + F32(1.0)) ** F32(0.5))


def _rounded(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.asarray(x, F32).astype(dtype).astype(F32)


def scale_model_input(sample: np.ndarray, sigma: np.float32) -> np.ndarray:
    """sample / sqrt(sigma^2 + 1) in the sample's dtype (a float32 scalar divides, torch rounds once)."""
    denom = (F32(sigma) ** 2 + F32(1.0)) ** F32(0.5)
    return (sample.astype(F32) / F32(denom)).astype(sample.dtype)


def euler_step(sample: np.ndarray, eps: np.ndarray, sigma: np.float32, sigma_next: np.float32) -> np.ndarray:
    """One EulerDiscreteScheduler.step (s_churn 0, epsilon prediction), result in eps's dtype:
    sample upcast to float32; x0 = sample - sigma * eps (the product rounded to eps's dtype, as a 0-d
    float32 tensor times a half tensor stays half); d = (sample - x0) / sigma; x + d * (sigma_next - sigma)."""
    dt = np.dtype(eps.dtype)
    x = sample.astype(F32)
    prod = _rounded(F32(sigma) * eps.astype(F32), dt) if dt != np.dtype(F32) else F32(sigma) * eps
    x0 = x - prod
    derivative = (x - x0) / F32(sigma)
    return (x + derivative * (F32(sigma_next) - F32(sigma))).astype(dt)
