"""Sigma schedules a user picks (`--scheduler`): the model's own flow-match sigmas redistributed as
diffusers' `FlowMatchEulerDiscreteScheduler` does with `use_karras_sigmas` / `use_exponential_sigmas` /
`use_beta_sigmas`.

Where it sits: after the frontend's schedule (linear sigmas + the model's shift rule) and before the
sampler (`dif.kit.sampling`). "simple" keeps the model's schedule; the others keep its end points
(sigma_max = the first shifted sigma, sigma_min = the last one before the terminal 0) and respace the
steps between them, in float64 from the float32 end points, rounded to float32 at the end (diffusers'
order). The terminal 0 is appended after, as ever.
"""

from __future__ import annotations

import math

import numpy as np

from dif.errors import UsageError

SCHEDULERS = ("simple", "karras", "exponential", "beta")
"""Sigma schedule names (`--scheduler`); "simple" is the checkpoint's own flow-match schedule."""

KARRAS_RHO = 7.0  # Karras et al. 2022's rho, diffusers' constant
BETA_ALPHA = BETA_BETA = 0.6  # diffusers' `_convert_to_beta` defaults


def respace_sigmas(sigmas: np.ndarray, scheduler: str) -> np.ndarray:
    """`sigmas` (n,) float32 (the shifted sigmas without the terminal 0) respaced by `scheduler`
    between their first and last value; (n,) float32. `UsageError` naming the option for an unknown
    name."""
    s = np.asarray(sigmas, dtype=np.float32)
    if scheduler == "simple":
        return s
    n = len(s)
    sigma_max, sigma_min = float(s[0]), float(s[-1])
    if scheduler == "karras":
        ramp = np.linspace(0, 1, n)
        lo, hi = sigma_min ** (1 / KARRAS_RHO), sigma_max ** (1 / KARRAS_RHO)
        out = (hi + ramp * (lo - hi)) ** KARRAS_RHO
    elif scheduler == "exponential":
        out = np.exp(np.linspace(math.log(sigma_max), math.log(sigma_min), n))
    elif scheduler == "beta":
        ppf = [beta_ppf(float(q), BETA_ALPHA, BETA_BETA) for q in 1 - np.linspace(0, 1, n)]
        out = np.array([sigma_min + p * (sigma_max - sigma_min) for p in ppf])
    else:
        raise UsageError(f"unknown scheduler '{scheduler}'", hint=f"--scheduler takes {', '.join(SCHEDULERS)}")
    return out.astype(np.float32)


def beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b) in float64 (the beta distribution's CDF):
    the continued fraction (modified Lentz) on the side of the mean where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - beta_cdf(1.0 - x, b, a)
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    frac = d
    for m in range(1, 300):
        for numer in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numer * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numer / c
            c = c if abs(c) > tiny else tiny
            frac *= c * d
        if abs(c * d - 1.0) < 1e-16:
            break
    return math.exp(log_front) * frac / a


def beta_ppf(q: float, a: float, b: float) -> float:
    """x with I_x(a, b) = q (the beta distribution's quantile), q in [0, 1]: bisection to the last
    bit of float64 (the CDF is monotone, so this cannot diverge)."""
    if q <= 0.0:
        return 0.0
    if q >= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if beta_cdf(mid, a, b) < q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
