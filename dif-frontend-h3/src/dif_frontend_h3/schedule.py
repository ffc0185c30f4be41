"""MiniMax-H3 flow schedules (MiniMaxH3Scheduler): one per stream, video shift 12 and audio shift 3.

Frontend stage 3, host-side numpy in float32 as the reference computes it (diffusers
schedulers/scheduling_minimax_h3.py): `n` grid points `linspace(1, 0, n)` (the terminal 0 included, so
n - 1 model evaluations), `sigma = s b / (1 + (s - 1) b)`, consecutive duplicates collapsed, model
timesteps `t = 1 - sigma` (t = 1 is clean, fed unscaled). A step takes the data-ward velocity v:
`x0 = x + (1 - t) v` (`1 - t` re-derived from t), `r = sigma_next / sigma`, `x' = r x + (1 - r) x0`.
"""

from __future__ import annotations

import numpy as np
from attrs import frozen

from dif.errors import UsageError


def linspace_f32(start: float, end: float, steps: int) -> np.ndarray:
    """torch.linspace(start, end, steps, dtype=float32) on CPU: step = (end - start) / (steps - 1) in fp32;
    the first half `start + step * i`, the second `end - step * (steps - 1 - i)`, each one fused
    multiply-add (exact product, one rounding: computed in float64 from the fp32 step, then rounded)."""
    if steps == 1:
        return np.asarray([start], np.float32)
    step = np.float64(np.float32((np.float32(end) - np.float32(start)) / np.float32(steps - 1)))
    i = np.arange(steps, dtype=np.float64)
    up = np.float64(np.float32(start)) + step * i
    down = np.float64(np.float32(end)) - step * (steps - 1 - i)
    return np.where(np.arange(steps) < steps // 2, up, down).astype(np.float32)


def shifted_sigmas(steps: int, shift: float) -> np.ndarray:
    """(m,) float32 sigmas from 1 to 0 (m <= steps after collapsing float32 collisions)."""
    if steps < 2:
        raise UsageError(f"--steps {steps}: MiniMax-H3 needs at least 2 grid points (1 model evaluation)")
    base = linspace_f32(1.0, 0.0, steps)
    s = np.float32(shift)
    sigmas = (s * base / (np.float32(1.0) + (s - np.float32(1.0)) * base)).astype(np.float32)
    keep = np.concatenate([[True], sigmas[1:] != sigmas[:-1]])
    return sigmas[keep]


@frozen(eq=False)
class H3Schedule:
    """The sigmas (m,) of one stream and its model timesteps (m - 1,) = 1 - sigmas[:-1]."""

    sigmas: np.ndarray

    @classmethod
    def make(cls, steps: int, shift: float) -> H3Schedule:
        return cls(shifted_sigmas(steps, shift))

    @property
    def timesteps(self) -> np.ndarray:
        return (np.float32(1.0) - self.sigmas[:-1]).astype(np.float32)

    def __len__(self) -> int:
        return len(self.sigmas) - 1

    def step(self, i: int, velocity: np.ndarray, sample: np.ndarray) -> np.ndarray:
        """Sample after evaluation i (float32 in and out) from the data-ward velocity at timesteps[i]."""
        t = self.timesteps[i]
        x = sample.astype(np.float32)
        x0 = x + (np.float32(1.0) - t) * velocity.astype(np.float32)
        r = np.float32(self.sigmas[i + 1] / self.sigmas[i])
        return (r * x + (np.float32(1.0) - r) * x0).astype(np.float32)
