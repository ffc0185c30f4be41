"""Norm + activation fusions for convolutional networks (UNet and VAE resnets: GroupNorm -> SiLU -> conv).

Like `dif.ops.fused`, these are made by an optimizer pass (`dif.passes.norm_act.fuse_group_norm_silu`),
never by a frontend, and a backend runs them only if it declares `op:<name>`. The reference rounds the
norm's result to the dtype the unfused program stored it in before the activation, so a fused program
is bit-identical to the unfused one on the CPU backend. Why fuse: in SD-Turbo's UNet and VAE every
GroupNorm's only user is a SiLU, and the pair reads and writes the whole activation twice unfused.
"""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.ir.types import TensorType
from dif.ops._rules import float_cases, fp
from dif.ops.elementwise import _sigmoid
from dif.ops.norm import _gn_infer, group_norm
from dif.ops.registry import AttrSpec, Case, defop


def _cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    shapes = [[(2, 8, 5, 6), (8,), (8,)], [(1, 12, 7), (12,), (12,)], [(1, 64, 16, 16), (64,), (64,)]]
    return float_cases(rng, dtype, shapes, groups=4, eps=1e-5)


def _infer(x: TensorType, w: TensorType, b: TensorType, *, groups: int, eps: float) -> TensorType:
    return _gn_infer(x, w, b, groups=groups, eps=eps)


@defop(
    "group_norm_silu",
    operands=("x", "w", "b"),
    attrs=(AttrSpec("groups", "int"), AttrSpec("eps", "float", 1e-6)),
    infer=_infer,
    cases=_cases,
    category="fused",
)
def group_norm_silu(x: np.ndarray, w: np.ndarray, b: np.ndarray, *, groups: int, eps: float) -> np.ndarray:
    """group_norm_silu(x[N, C, ...], w[C], b[C]; groups, eps) = silu(group_norm(x, w, b; groups, eps)),
    the norm's result rounded to x's dtype first (as the unfused pair stores it)."""
    normed = fp(np.asarray(group_norm(x, w, b, groups=groups, eps=eps)).astype(x.dtype, copy=False))
    return normed * _sigmoid(normed)  # silu's reference, on the stored norm
