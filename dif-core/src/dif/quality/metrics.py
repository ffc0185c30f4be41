"""Numeric image and audio comparisons for `dif quality` (after a pipeline wrote its media file).

PSNR over all channels of 8-bit pixels; SSIM on BT.601 luma with 8x8 sliding windows (uniform
weights, every window position, C1 = (0.01 L)^2, C2 = (0.03 L)^2, L = 255), averaged over windows;
audio SNR = 10 log10(sum r^2 / sum (c - r)^2) over the overlapping samples.
"""

from __future__ import annotations

import math

import numpy as np

WINDOW = 8
PEAK = 255.0


def psnr(candidate: np.ndarray, reference: np.ndarray) -> float | None:
    """PSNR in dB of two uint8 images of one shape; None when they are identical (infinite)."""
    c = candidate.astype(np.float64)
    r = reference.astype(np.float64)
    mse = float(np.mean((c - r) ** 2))
    return None if mse == 0.0 else 10.0 * math.log10(PEAK * PEAK / mse)


def luma(image: np.ndarray) -> np.ndarray:
    """[H, W] float64 luma of an [H, W] or [H, W, C] uint8 image (C >= 3 uses BT.601 weights; alpha ignored)."""
    x = image.astype(np.float64)
    if x.ndim == 2:
        return x
    if x.shape[2] >= 3:
        return 0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]
    return x[..., 0]


def _window_sums(x: np.ndarray) -> np.ndarray:
    """Sum of every WINDOW x WINDOW window of x ([H-7, W-7]) from an integral image."""
    s = np.zeros((x.shape[0] + 1, x.shape[1] + 1))
    s[1:, 1:] = x.cumsum(0).cumsum(1)
    w = WINDOW
    return s[w:, w:] - s[:-w, w:] - s[w:, :-w] + s[:-w, :-w]  # type: ignore[no-any-return]


def ssim(candidate: np.ndarray, reference: np.ndarray) -> float:
    """Mean SSIM over all 8x8 luma windows; images smaller than 8x8 are compared as one window."""
    a, b = luma(candidate), luma(reference)
    if a.shape[0] < WINDOW or a.shape[1] < WINDOW:
        pad = ((0, max(0, WINDOW - a.shape[0])), (0, max(0, WINDOW - a.shape[1])))
        a, b = np.pad(a, pad, mode="edge"), np.pad(b, pad, mode="edge")
    n = WINDOW * WINDOW
    ma, mb = _window_sums(a) / n, _window_sums(b) / n
    va = _window_sums(a * a) / n - ma * ma
    vb = _window_sums(b * b) / n - mb * mb
    cov = _window_sums(a * b) / n - ma * mb
    c1, c2 = (0.01 * PEAK) ** 2, (0.03 * PEAK) ** 2
    s = ((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))
    return float(np.mean(s))


def snr(candidate: np.ndarray, reference: np.ndarray) -> float | None:
    """Audio SNR in dB of `candidate` against `reference` ([samples] or [samples, channels], float);
    None when they are identical. Compared over the shorter length."""
    n = min(len(candidate), len(reference))
    c = np.asarray(candidate[:n], dtype=np.float64)
    r = np.asarray(reference[:n], dtype=np.float64)
    noise = float(np.sum((c - r) ** 2))
    signal = float(np.sum(r * r))
    if noise == 0.0:
        return None
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
