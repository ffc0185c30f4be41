"""Shared helpers for op definitions: type-rule checks, compute precision, case generators."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.dtypes import FLOAT_DTYPES, DType
from dif.errors import TypeRuleError
from dif.ir.types import TensorType
from dif.ops.registry import Case


def fail(message: str) -> TypeRuleError:
    return TypeRuleError(message)


def need_float(*types: TensorType) -> None:
    for t in types:
        if t.dtype not in FLOAT_DTYPES:
            raise fail(f"expects a float tensor, got {t}")


def need_same_dtype(*types: TensorType) -> DType:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise fail(f"operands must share one dtype, got {', '.join(str(t) for t in types)}")
    return types[0].dtype


def need_rank(t: TensorType, *ranks: int, what: str = "operand") -> None:
    if t.rank not in ranks:
        raise fail(f"{what} must have rank {' or '.join(map(str, ranks))}, got {t}")


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise fail(f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError:
        raise fail(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast") from None


def same(x: TensorType, **_: object) -> TensorType:
    return x


def same_float(x: TensorType, **_: object) -> TensorType:
    need_float(x)
    return x


def fp(x: np.ndarray) -> np.ndarray:
    """Upcast to the reference compute precision: fp32, or fp64 for float64 checks."""
    if x.dtype == np.float64:
        return x
    return x.astype(np.float32)


# -- case generators ---------------------------------------------------------------------------


def randn(rng: np.random.Generator, shape: Sequence[int], dtype: DType, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(tuple(shape)) * scale).astype(dtype.np)


def float_cases(
    rng: np.random.Generator, dtype: DType, shapes: Sequence[Sequence[Sequence[int]]], **attrs: object
) -> list[Case]:
    """One case per operand-shape list, float inputs; empty for non-float dtypes."""
    if dtype not in FLOAT_DTYPES or dtype in (DType.F8E4M3, DType.F8E5M2):
        return []
    return [
        Case(f"{'x'.join(str(s) for s in shp[0]) or 'scalar'}", tuple(randn(rng, s, dtype) for s in shp), dict(attrs))
        for shp in shapes
    ]
