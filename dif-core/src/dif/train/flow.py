"""Flow-matching training targets, as diffusers' flow-matching training examples make them.

x_t = (1 - sigma) x0 + sigma * noise and the model learns the velocity noise - x0; sigma is drawn
per sample by `scheme` ("uniform", or "logit_normal": sigmoid of N(mean, std)), then the schedule's
shift applied (sigma' = shift sigma / (1 + (shift - 1) sigma)), as the scheduler's training sigmas are.
"""

from __future__ import annotations

import numpy as np
from attrs import frozen

from dif.errors import UsageError

SCHEMES = ("uniform", "logit_normal")


@frozen
class FlowBatch:
    noisy: np.ndarray
    target: np.ndarray
    sigmas: np.ndarray  # (B,) in (0, 1]


def sample_sigmas(
    rng: np.random.Generator, batch: int, *, scheme: str = "uniform", shift: float = 1.0, mean: float = 0.0,
    std: float = 1.0, num_train_timesteps: int = 1000,
) -> np.ndarray:  # fmt: skip
    """(batch,) float32 sigmas on the scheduler's training grid (index = floor(u * N), sigma = 1 - i/N)."""
    if scheme == "uniform":
        u = rng.random(batch)
    elif scheme == "logit_normal":
        u = 1 / (1 + np.exp(-rng.normal(mean, std, batch)))
    else:
        raise UsageError(f"timestep sampling '{scheme}' is not one of {', '.join(SCHEMES)}")
    idx = np.minimum((u * num_train_timesteps).astype(np.int64), num_train_timesteps - 1)
    sigma = 1.0 - idx / num_train_timesteps  # the training timesteps N..1 as sigmas 1..1/N
    if shift != 1.0:
        sigma = shift * sigma / (1 + (shift - 1) * sigma)
    return sigma.astype(np.float32)


def flow_batch(latents: np.ndarray, rng: np.random.Generator, sigmas: np.ndarray) -> FlowBatch:
    """latents (B, ...) float32 -> noisy latents and velocity targets for the given sigmas."""
    noise = rng.standard_normal(latents.shape).astype(np.float32)
    s = sigmas.reshape((-1,) + (1,) * (latents.ndim - 1)).astype(np.float32)
    x0 = latents.astype(np.float32)
    return FlowBatch(((1 - s) * x0 + s * noise).astype(np.float32), (noise - x0).astype(np.float32), sigmas)
