"""Reductions over a set of axes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dif.ir.types import TensorType
from dif.ops._rules import fail, float_cases, fp, need_float, norm_axis
from dif.ops.registry import AttrSpec, defop


def _reduce_infer(x: TensorType, *, axes: tuple[int, ...], keepdims: bool) -> TensorType:
    need_float(x)
    norm = sorted({norm_axis(a, x.rank) for a in axes})
    if len(norm) != len(axes) or not axes:
        raise fail(f"axes {list(axes)} must be distinct and non-empty")
    shape = [1 if i in norm else d for i, d in enumerate(x.shape) if keepdims or i not in norm]
    return TensorType(shape, x.dtype)


def _reduce(name: str, fn: Callable[..., np.ndarray], doc: str) -> None:
    def reference(x: np.ndarray, *, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        return fn(fp(x), axis=tuple(axes), keepdims=keepdims)

    reference.__doc__ = doc
    defop(
        name,
        operands=("x",),
        attrs=(AttrSpec("axes", "ints"), AttrSpec("keepdims", "bool", False)),
        infer=_reduce_infer,
        cases=lambda rng, dt: (
            float_cases(rng, dt, [[(2, 3, 4)]], axes=(1,))
            + float_cases(rng, dt, [[(2, 3, 4)]], axes=(0, 2), keepdims=True)
        ),
        category="reduce",
    )(reference)


_reduce("reduce_sum", np.sum, "reduce_sum(x; axes, keepdims): sum over axes, fp32 accumulation.")
_reduce("reduce_mean", np.mean, "reduce_mean(x; axes, keepdims): mean over axes, fp32 accumulation.")
_reduce("reduce_max", np.max, "reduce_max(x; axes, keepdims): maximum over axes.")
