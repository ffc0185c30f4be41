"""Host-side constant tables that frontends feed to DiffIR programs as inputs.

RoPE cos/sin tables and sinusoidal timestep embeddings are computed in numpy once per shape (or
per step) and uploaded; the graph only applies them (`rope` op, first `linear` of a time MLP).
The arithmetic order and precision follow the reference implementations noted on each function.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.errors import DifError


def sinusoidal_embedding(
    t: Sequence[float] | np.ndarray,
    dim: int,
    *,
    flip_sin_to_cos: bool = True,
    downscale_freq_shift: float = 0.0,
    max_period: float = 10000.0,
    scale: float = 1.0,
) -> np.ndarray:
    """Sinusoidal embedding of timesteps t (B,) -> (B, dim) float32.

    frequencies f_i = exp(-ln(max_period) * i / (dim/2 - downscale_freq_shift)) for i < dim/2, all in
    float32 like the reference; output [cos(t f) | sin(t f)] when flip_sin_to_cos else [sin | cos]
    (odd `dim` is zero-padded by one column).
    """
    t32 = np.asarray(t, dtype=np.float32).reshape(-1)
    half = dim // 2
    if half == 0:
        raise DifError(f"sinusoidal_embedding: dim must be >= 2, got {dim}")
    exponent = (-np.float32(np.log(max_period)) * np.arange(half, dtype=np.float32)).astype(np.float32)
    exponent = exponent / np.float32(half - downscale_freq_shift)
    # exp in float64 rounded once: numpy's float32 exp is off by an ulp for many entries, which moves
    # angles t*f by ~1e-4 rad at t ~ 1000 (torch's fp32 exp is correctly rounded almost everywhere)
    freqs = np.exp(exponent.astype(np.float64)).astype(np.float32)
    angles = (t32[:, None] * freqs[None, :]).astype(np.float32) * np.float32(scale)
    sin, cos = np.sin(angles), np.cos(angles)
    out = np.concatenate([cos, sin] if flip_sin_to_cos else [sin, cos], axis=-1)
    if dim % 2:
        out = np.pad(out, ((0, 0), (0, 1)))
    return out.astype(np.float32)


def rope_pairs_tables(ids: np.ndarray, axes_dims: Sequence[int], theta: float) -> tuple[np.ndarray, np.ndarray]:
    """Axial RoPE tables for interleaved-pair rotation (`rope(mode="pairs")`).

    ids (S, A) positions per axis (cast to float32 first, as the reference does); axis a of width
    axes_dims[a] uses frequencies theta^(-2j/d_a), j < d_a/2, with angles computed in float64,
    each cos/sin value repeated twice (pair layout), axes concatenated.
    Returns cos, sin float32 of shape (S, sum(axes_dims)).
    """
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.shape[1] < len(axes_dims):
        raise DifError(f"rope_pairs_tables: ids must be (S, >= {len(axes_dims)}), got shape {ids.shape}")
    pos = ids.astype(np.float32).astype(np.float64)
    cos_parts, sin_parts = [], []
    for axis, d in enumerate(axes_dims):
        if d % 2:
            raise DifError(f"rope_pairs_tables: axis width {d} must be even")
        freqs = 1.0 / (float(theta) ** (np.arange(0, d, 2, dtype=np.float64)[: d // 2] / d))
        angles = np.outer(pos[:, axis], freqs)
        cos_parts.append(np.repeat(np.cos(angles), 2, axis=1))
        sin_parts.append(np.repeat(np.sin(angles), 2, axis=1))
    cos = np.concatenate(cos_parts, axis=1).astype(np.float32)
    sin = np.concatenate(sin_parts, axis=1).astype(np.float32)
    return cos, sin


def rope_half_tables(positions: Sequence[int] | np.ndarray, dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """RoPE tables for half-split rotation (`rope(mode="half")`), float32 arithmetic throughout.

    inv_freq_j = 1 / theta^(2j/dim); angle = pos * inv_freq; table = [a | a] (width dim).
    Returns cos, sin float32 (S, dim); cast them to the program dtype where the reference does.
    """
    if dim % 2:
        raise DifError(f"rope_half_tables: dim must be even, got {dim}")
    pos = np.asarray(positions, dtype=np.float32).reshape(-1)
    inv_freq = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    angles = (pos[:, None] * inv_freq.astype(np.float32)[None, :]).astype(np.float32)
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def grid_ids(*axes: Sequence[int] | np.ndarray) -> np.ndarray:
    """Cartesian product of per-axis coordinates, last axis fastest: (prod(len), n_axes) int64."""
    grids = np.meshgrid(*[np.asarray(a, dtype=np.int64) for a in axes], indexing="ij")
    return np.stack([g.reshape(-1) for g in grids], axis=1)
