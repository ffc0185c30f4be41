"""Layout ops: reshape, transpose, concat, split, slice, pad, broadcast, gather. Pure data movement."""

from __future__ import annotations

import math

import numpy as np

from dif.dtypes import FLOAT_DTYPES, INT_DTYPES, DType
from dif.ir.types import TensorType
from dif.ops._rules import fail, float_cases, norm_axis, randn
from dif.ops.registry import AttrSpec, Case, defop


def _layout_cases(in_shape: tuple[int, ...], **attrs: object):  # type: ignore[no-untyped-def]
    return lambda rng, dt: float_cases(rng, dt, [[in_shape]], **attrs)


def _reshape_infer(x: TensorType, *, shape: tuple[int, ...]) -> TensorType:
    if sum(1 for d in shape if d == -1) > 1 or any(d < -1 for d in shape):
        raise fail(f"bad target shape {list(shape)} (at most one -1)")
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or x.numel % known:
            raise fail(f"cannot reshape {x} to {list(shape)}")
        shape = tuple(x.numel // known if d == -1 else d for d in shape)
    if math.prod(shape) != x.numel:
        raise fail(f"cannot reshape {x} ({x.numel} elements) to {list(shape)}")
    return TensorType(shape, x.dtype)


@defop(
    "reshape",
    operands=("x",),
    attrs=(AttrSpec("shape", "ints", doc="target shape, one -1 allowed"),),
    infer=_reshape_infer,
    cases=lambda rng, dt: (
        _layout_cases((2, 3, 4), shape=(4, -1))(rng, dt) + _layout_cases((6,), shape=(1, 2, 3))(rng, dt)
    ),
    category="layout",
)
def reshape(x: np.ndarray, *, shape: tuple[int, ...]) -> np.ndarray:
    """reshape(x; shape): same elements in row-major order, new shape (one -1 is inferred)."""
    return x.reshape(shape)


def _transpose_infer(x: TensorType, *, perm: tuple[int, ...]) -> TensorType:
    if sorted(perm) != list(range(x.rank)):
        raise fail(f"perm {list(perm)} is not a permutation of the {x.rank} axes of {x}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


@defop(
    "transpose",
    operands=("x",),
    attrs=(AttrSpec("perm", "ints"),),
    infer=_transpose_infer,
    cases=_layout_cases((2, 3, 4, 5), perm=(0, 2, 1, 3)),
    category="layout",
)
def transpose(x: np.ndarray, *, perm: tuple[int, ...]) -> np.ndarray:
    """transpose(x; perm): result axis i is input axis perm[i]."""
    return np.ascontiguousarray(np.transpose(x, perm))


def _concat_infer(*xs: TensorType, axis: int) -> TensorType:
    if not xs:
        raise fail("concat needs at least one operand")
    a = norm_axis(axis, xs[0].rank)
    for t in xs[1:]:
        if (
            t.dtype != xs[0].dtype
            or t.rank != xs[0].rank
            or any(d != e for i, (d, e) in enumerate(zip(t.shape, xs[0].shape, strict=True)) if i != a)
        ):
            raise fail(f"cannot concat {t} with {xs[0]} along axis {axis}")
    shape = list(xs[0].shape)
    shape[a] = sum(t.shape[a] for t in xs)
    return TensorType(shape, xs[0].dtype)


def _concat_cases(rng: np.random.Generator, dt: DType) -> list[Case]:
    return float_cases(rng, dt, [[(2, 3, 4), (2, 5, 4), (2, 1, 4)]], axis=1) + float_cases(
        rng, dt, [[(3, 2), (3, 2)]], axis=-1
    )


@defop(
    "concat",
    operands=("xs*",),
    attrs=(AttrSpec("axis", "int"),),
    infer=_concat_infer,
    cases=_concat_cases,
    category="layout",
)
def concat(*xs: np.ndarray, axis: int) -> np.ndarray:
    """concat(xs...; axis): join tensors of equal shape except along axis."""
    return np.concatenate(xs, axis=axis)


def _split_infer(x: TensorType, *, axis: int, sizes: tuple[int, ...]) -> tuple[TensorType, ...]:
    a = norm_axis(axis, x.rank)
    if not sizes or any(s < 0 for s in sizes) or sum(sizes) != x.shape[a]:
        raise fail(f"sizes {list(sizes)} must be non-negative and sum to {x.shape[a]} (axis {axis} of {x})")
    out = []
    for s in sizes:
        shape = list(x.shape)
        shape[a] = s
        out.append(TensorType(shape, x.dtype))
    return tuple(out)


@defop(
    "split",
    operands=("x",),
    attrs=(AttrSpec("axis", "int"), AttrSpec("sizes", "ints")),
    infer=_split_infer,
    cases=_layout_cases((2, 10, 3), axis=1, sizes=(3, 3, 4)),
    category="layout",
    num_results=None,
)
def split(x: np.ndarray, *, axis: int, sizes: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """split(x; axis, sizes) -> one result per size: consecutive pieces along axis."""
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _slice_infer(x: TensorType, *, axis: int, start: int, stop: int, step: int) -> TensorType:
    a = norm_axis(axis, x.rank)
    if step < 1:
        raise fail(f"step must be >= 1, got {step}")
    n = len(range(*slice(start, stop, step).indices(x.shape[a])))
    shape = list(x.shape)
    shape[a] = n
    return TensorType(shape, x.dtype)


@defop(
    "slice",
    operands=("x",),
    attrs=(AttrSpec("axis", "int"), AttrSpec("start", "int"), AttrSpec("stop", "int"), AttrSpec("step", "int", 1)),
    infer=_slice_infer,
    cases=lambda rng, dt: (
        _layout_cases((3, 9, 2), axis=1, start=2, stop=8, step=2)(rng, dt)
        + _layout_cases((5, 4), axis=0, start=-3, stop=5)(rng, dt)
    ),
    category="layout",
)
def slice_(x: np.ndarray, *, axis: int, start: int, stop: int, step: int) -> np.ndarray:
    """slice(x; axis, start, stop, step): x[start:stop:step] along axis, Python slice semantics
    (negative indices count from the end, out-of-range bounds clip)."""
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop, step)
    return x[tuple(index)]


def _pad_infer(x: TensorType, *, pads: tuple[int, ...], value: float, mode: str) -> TensorType:
    if len(pads) != 2 * x.rank or min(pads, default=0) < 0:
        raise fail(f"pads needs {2 * x.rank} non-negative values (before, after per axis), got {list(pads)}")
    if mode == "reflect" and any(
        p >= max(d, 1) for i, d in enumerate(x.shape) for p in (pads[2 * i], pads[2 * i + 1]) if p
    ):
        raise fail(f"reflect padding {list(pads)} must be smaller than each padded dim of {x}")
    return TensorType(tuple(d + pads[2 * i] + pads[2 * i + 1] for i, d in enumerate(x.shape)), x.dtype)


@defop(
    "pad",
    operands=("x",),
    attrs=(
        AttrSpec("pads", "ints", doc="(before0, after0, before1, after1, ...)"),
        AttrSpec("value", "float", 0.0),
        AttrSpec("mode", "str", "constant", ("constant", "reflect")),
    ),
    infer=_pad_infer,
    cases=lambda rng, dt: (
        _layout_cases((1, 2, 4, 5), pads=(0, 0, 0, 0, 1, 2, 0, 1))(rng, dt)
        + _layout_cases((1, 2, 4, 5), pads=(0, 0, 0, 0, 1, 1, 2, 1), mode="reflect")(rng, dt)
    ),
    category="layout",
)
def pad(x: np.ndarray, *, pads: tuple[int, ...], value: float, mode: str) -> np.ndarray:
    """pad(x; pads, value, mode): constant (value) or reflect (mirror without repeating the edge) padding."""
    widths = [(pads[2 * i], pads[2 * i + 1]) for i in range(x.ndim)]
    if mode == "reflect":
        return np.pad(x, widths, mode="reflect")
    return np.pad(x, widths, constant_values=np.asarray(value).astype(x.dtype))


def _bcast_infer(x: TensorType, *, shape: tuple[int, ...]) -> TensorType:
    try:
        np.broadcast_shapes(x.shape, tuple(shape))
    except ValueError:
        raise fail(f"{x} does not broadcast to {list(shape)}") from None
    if tuple(np.broadcast_shapes(x.shape, tuple(shape))) != tuple(shape):
        raise fail(f"{x} does not broadcast to {list(shape)}")
    return TensorType(shape, x.dtype)


@defop(
    "broadcast_to",
    operands=("x",),
    attrs=(AttrSpec("shape", "ints"),),
    infer=_bcast_infer,
    cases=_layout_cases((3, 1), shape=(2, 3, 4)),
    category="layout",
)
def broadcast_to(x: np.ndarray, *, shape: tuple[int, ...]) -> np.ndarray:
    """broadcast_to(x; shape): numpy broadcasting made explicit (materialized)."""
    return np.ascontiguousarray(np.broadcast_to(x, shape))


def _index_cases(rng: np.random.Generator, dt: DType, n: int, shape: tuple[int, ...], **attrs: object) -> list[Case]:
    if dt not in FLOAT_DTYPES or not dt.np.itemsize > 1:
        return []
    idx = rng.integers(0, n, (2, 3)).astype(np.int64)
    return [
        Case("i64", (randn(rng, shape, dt), idx), dict(attrs)),
        Case("i32", (randn(rng, shape, dt), idx.astype(np.int32)), dict(attrs)),
    ]


def _take_infer(x: TensorType, idx: TensorType, *, axis: int) -> TensorType:
    if idx.dtype not in INT_DTYPES:
        raise fail(f"indices must be integers, got {idx}")
    a = norm_axis(axis, x.rank)
    return TensorType((*x.shape[:a], *idx.shape, *x.shape[a + 1 :]), x.dtype)


@defop(
    "take",
    operands=("x", "idx"),
    attrs=(AttrSpec("axis", "int"),),
    infer=_take_infer,
    cases=lambda rng, dt: _index_cases(rng, dt, 5, (4, 5, 3), axis=1),
    category="layout",
)
def take(x: np.ndarray, idx: np.ndarray, *, axis: int) -> np.ndarray:
    """take(x, idx; axis): gather along axis; result shape x.shape[:axis] + idx.shape + x.shape[axis+1:].
    Indices must be in range (checked by the reference)."""
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[axis]):
        raise IndexError(f"index out of range for axis of size {x.shape[axis]}")
    return np.take(x, idx, axis=axis)


def _embedding_infer(ids: TensorType, table: TensorType) -> TensorType:
    if ids.dtype not in INT_DTYPES:
        raise fail(f"ids must be integers, got {ids}")
    if table.rank != 2:
        raise fail(f"table must be [V, D], got {table}")
    return TensorType((*ids.shape, table.shape[1]), table.dtype)


def _embedding_cases(rng: np.random.Generator, dt: DType) -> list[Case]:
    return [Case(c.name, (c.operands[1], c.operands[0][:, :, 0])) for c in _index_cases(rng, dt, 7, (7, 6, 1))]


@defop("embedding", operands=("ids", "table"), infer=_embedding_infer, cases=_embedding_cases, category="layout")
def embedding(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """embedding(ids[...], table[V, D]) -> [..., D]: row lookup (ids must be in [0, V))."""
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise IndexError(f"token id out of range for a table of {table.shape[0]} rows")
    return table[ids]
