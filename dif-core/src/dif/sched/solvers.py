"""The per-step arithmetic of the flow-match samplers beyond Euler: Heun (2nd order, two model calls
a step) and DPM-Solver++(2M) (2nd order multistep, one call a step), in their flow-matching forms.

Where it sits: under `dif.kit.sampling.sample`, which owns the loop, the model calls and the finite
checks. Conventions as `dif.sched.flow_match`: the model predicts v = noise - x0 at sigma, so
x0 = x - sigma * v. Each function follows the diffusers scheduler of the same name operation by
operation (`FlowMatchHeunDiscreteScheduler.step`; `DPMSolverMultistepScheduler.step` with
`use_flow_sigmas=True, prediction_type="flow_prediction"`, midpoint solver, first order on the first
and the last step), in float32 for float32 / narrower latents and in float64 for float64 ones; the
result is cast back to the latents' dtype. With bf16 / f16 latents and model outputs the roundings
are torch's too: a float32 0-d tensor times a bf16 tensor is the float32 product rounded to bf16, the
scalar itself first rounded when it is the left operand (`scaled`); bf16 - bf16 is rounded to bf16; the
sample is upcast to float32 where diffusers upcasts it.
"""

from __future__ import annotations

import numpy as np

SAMPLERS = ("euler", "heun", "dpm++2m")
"""Sampler names (`--sampling-method`, as stable-diffusion.cpp spells them)."""

MODEL_CALLS = {"euler": 1, "heun": 2, "dpm++2m": 1}
"""Model calls per step (Heun's last step is a plain Euler step: 2n - 1 calls for n steps)."""


def compute_dtype(dtype: np.dtype) -> type[np.floating]:
    """float64 for float64 latents, float32 for every other dtype."""
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def narrow(dtype: np.dtype) -> bool:
    """A float dtype narrower than float32 (bf16, f16)."""
    return np.dtype(dtype).itemsize < 4


def scaled(scalar: np.floating | float, tensor: np.ndarray, *, scalar_first: bool = True) -> np.ndarray:
    """`scalar * tensor` (or `tensor * scalar`, `scalar_first=False`) as torch computes a 0-d float32
    tensor and `tensor`: in the tensor's dtype. For bf16 / f16 the product is taken in float32 and rounded;
    torch's fast path for a CPU scalar applies only when the scalar is the second operand, so first, it is
    rounded to the tensor's dtype before the product (measured: 48% of products differ otherwise)."""
    arr = np.asarray(tensor)
    if narrow(arr.dtype):
        s = np.float32(scalar)
        if scalar_first:
            s = np.float32(np.asarray(s).astype(arr.dtype))
        return (s * arr.astype(np.float32)).astype(arr.dtype)
    return arr.dtype.type(scalar) * arr


def _minus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a - b in their dtype (bf16 / f16: in float32, rounded)."""
    if narrow(a.dtype):
        return (a.astype(np.float32) - b.astype(np.float32)).astype(a.dtype)
    return a - b


def heun_derivative(sample: np.ndarray, velocity: np.ndarray, sigma: np.floating) -> np.ndarray:
    """The ODE derivative (x - x0) / sigma with x0 = x - sigma * v, as diffusers forms it (not v itself:
    the rounding differs): x upcast, sigma * v in v's dtype."""
    v = np.asarray(velocity)
    ct = compute_dtype(v.dtype)
    x = np.asarray(sample, dtype=ct)
    s = ct(sigma)
    denoised = x - scaled(s, v, scalar_first=False).astype(ct)  # diffusers: model_output * sigma
    return (x - denoised) / s


def heun_predict(sample: np.ndarray, derivative: np.ndarray, dt: np.floating, dtype: np.dtype) -> np.ndarray:
    """x + d * dt in the compute dtype, cast to `dtype`: the Euler predictor (and, with the averaged
    derivative, Heun's corrector from the same x)."""
    ct = compute_dtype(np.dtype(dtype))
    return (np.asarray(sample, dtype=ct) + derivative * ct(dt)).astype(dtype)


def dpm_x0(sample: np.ndarray, velocity: np.ndarray, sigma: np.floating) -> np.ndarray:
    """The data prediction x0 = x - sigma * v in the velocity's dtype (diffusers' `convert_model_output`
    for flow prediction, before the sample is upcast)."""
    v = np.asarray(velocity)
    ct = compute_dtype(v.dtype)
    return _minus(np.asarray(sample).astype(v.dtype), scaled(ct(sigma), v))


def _lam(sigma: np.floating, ct: type[np.floating]) -> np.floating:
    """lambda = log(alpha) - log(sigma), alpha = 1 - sigma (+inf at sigma 0, -inf at sigma 1)."""
    s = ct(sigma)
    with np.errstate(divide="ignore"):
        return ct(np.log(ct(1) - s) - np.log(s))


def dpmpp_2m_step(
    sample: np.ndarray,
    x0: np.ndarray,
    prev_x0: np.ndarray | None,
    sigmas: np.ndarray,
    i: int,
    dtype: np.dtype,
) -> np.ndarray:
    """Step i of DPM-Solver++(2M) from sigma_i to sigma_{i+1} of `sigmas` ((n+1,), ending in 0) given this
    step's data prediction `x0` and the previous step's (`prev_x0`; None on the first step). First order
    (DDIM) on the first and the last step, the midpoint 2nd-order update otherwise. Cast to `dtype`."""
    ct = compute_dtype(np.dtype(dtype))
    n = len(sigmas) - 1
    x = np.asarray(sample, dtype=ct)
    sigma_t, sigma_s0 = ct(sigmas[i + 1]), ct(sigmas[i])
    alpha_t = ct(1) - sigma_t
    lam_t, lam_s0 = _lam(sigma_t, ct), _lam(sigma_s0, ct)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        h = ct(lam_t - lam_s0)
        coeff = ct(alpha_t * ct(np.exp(-h) - ct(1)))
        ratio = ct(sigma_t / sigma_s0)
        if prev_x0 is None or i == n - 1:
            out = ratio * x - scaled(coeff, x0).astype(ct)
        else:
            h_0 = ct(lam_s0 - _lam(sigmas[i - 1], ct))
            r0 = ct(h_0 / h)
            d1 = scaled(ct(ct(1) / r0), _minus(x0, prev_x0))
            out = ratio * x - scaled(coeff, x0).astype(ct) - scaled(ct(ct(0.5) * coeff), d1).astype(ct)
    return out.astype(dtype)
