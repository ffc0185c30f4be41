"""Matrix products: `linear` (torch Linear layout) and batched `matmul`."""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.ir.types import TensorType
from dif.ops._rules import broadcast_shape, fail, float_cases, fp, need_float, need_same_dtype
from dif.ops.registry import Case, defop


def _linear_infer(x: TensorType, w: TensorType, bias: TensorType | None = None) -> TensorType:
    need_float(x)
    need_same_dtype(*(t for t in (x, w, bias) if t is not None))
    if w.rank != 2 or x.rank < 1:
        raise fail(f"weight must be [out, in] and x [..., in]; got x {x}, w {w}")
    if x.shape[-1] != w.shape[1]:
        raise fail(f"x has {x.shape[-1]} input features but weight {w} expects {w.shape[1]}")
    if bias is not None and bias.shape != (w.shape[0],):
        raise fail(f"bias must be [{w.shape[0]}], got {bias}")
    return TensorType((*x.shape[:-1], w.shape[0]), x.dtype)


def _linear_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    with_bias = float_cases(rng, dtype, [[(2, 5, 16), (8, 16), (8,)], [(3, 7), (5, 7), (5,)]])
    no_bias = float_cases(rng, dtype, [[(4, 32), (24, 32)]])
    return with_bias + no_bias


@defop("linear", operands=("x", "w", "bias?"), infer=_linear_infer, cases=_linear_cases, category="linalg")
def linear(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """linear(x[..., in], w[out, in], bias?[out]) -> [..., out] = x @ w^T + bias.

    The weight keeps torch's [out, in] layout so checkpoints bind without a transpose.
    Accumulation is fp32 (fp64 in float64 checks)."""
    y = fp(x) @ fp(w).T
    if bias is not None:
        y = y + fp(bias)
    return y


def _matmul_infer(a: TensorType, b: TensorType) -> TensorType:
    need_float(a)
    need_same_dtype(a, b)
    if a.rank < 2 or b.rank < 2:
        raise fail(f"matmul needs rank >= 2 operands, got {a} and {b}")
    if a.shape[-1] != b.shape[-2]:
        raise fail(f"contracting dims differ: {a} @ {b}")
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    return TensorType((*batch, a.shape[-2], b.shape[-1]), a.dtype)


@defop(
    "matmul",
    operands=("a", "b"),
    infer=_matmul_infer,
    cases=lambda rng, dt: float_cases(
        rng, dt, [[(2, 3, 4, 8), (2, 3, 8, 5)], [(6, 7), (7, 3)], [(2, 1, 4, 8), (3, 8, 2)]]
    ),
    category="linalg",
)
def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """matmul(a[..., m, k], b[..., k, n]) -> [..., m, n] with broadcast batch dims, fp32 accumulation."""
    return np.matmul(fp(a), fp(b))
