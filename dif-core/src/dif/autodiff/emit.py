"""Small DiffIR idioms the VJP rules share: constants, un-broadcasting, masks, flips, iota."""

from __future__ import annotations

from collections.abc import Sequence

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var


def const(b: ProgramBuilder, value: float, dtype: DType, shape: Sequence[int] = ()) -> Var:
    return b.emit("full", shape=tuple(shape), value=float(value), dtype=DType(dtype).value)


def zeros_like(b: ProgramBuilder, x: Var) -> Var:
    return const(b, 0.0, x.dtype, x.shape)


def scale(b: ProgramBuilder, x: Var, factor: float) -> Var:
    return b.emit("scalar_affine", x, scale=float(factor), bias=0.0)


def mask_of(b: ProgramBuilder, cond: Var, dtype: DType) -> Var:
    """A bool tensor as 0/1 of `dtype`."""
    return b.emit("cast", cond, dtype=DType(dtype).value)


def sum_to(b: ProgramBuilder, g: Var, shape: Sequence[int]) -> Var:
    """Undo numpy broadcasting: sum `g` over the axes that broadcasting added or stretched from 1."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = len(g.shape) - len(shape)
    if lead:
        g = b.emit("reduce_sum", g, axes=tuple(range(lead)))
    stretched = tuple(i for i, (d, e) in enumerate(zip(shape, g.shape, strict=True)) if d == 1 and e != 1)
    if stretched:
        g = b.emit("reduce_sum", g, axes=stretched, keepdims=True)
    if g.shape != shape:
        g = b.emit("reshape", g, shape=shape)
    return g


def add_all(b: ProgramBuilder, parts: Sequence[Var]) -> Var:
    out = parts[0]
    for p in parts[1:]:
        out = b.emit("add", out, p)
    return out


def flip(b: ProgramBuilder, x: Var, axis: int) -> Var:
    """x reversed along `axis`, from one slice per index (meant for short axes: kernels, pads)."""
    n = x.shape[axis]
    if n == 1:
        return x
    parts = [b.emit("slice", x, axis=axis, start=i, stop=i + 1) for i in reversed(range(n))]
    return b.emit("concat", *parts, axis=axis)


def interleave_zeros(b: ProgramBuilder, x: Var, axis: int, step: int) -> Var:
    """Put step-1 zeros after every element along `axis` and drop the trailing ones:
    length n -> (n-1)*step + 1 (the adjoint of a strided slice, and a strided conv's dilation)."""
    if step == 1:
        return x
    a = axis % x.type.rank
    n = x.shape[a]
    y = b.emit("reshape", x, shape=(*x.shape[: a + 1], 1, *x.shape[a + 1 :]))
    pads = [0] * (2 * y.type.rank)
    pads[2 * (a + 1) + 1] = step - 1
    y = b.emit("pad", y, pads=tuple(pads))
    y = b.emit("reshape", y, shape=(*x.shape[:a], n * step, *x.shape[a + 1 :]))
    return b.emit("slice", y, axis=a, start=0, stop=(n - 1) * step + 1)


def pad_axis(b: ProgramBuilder, x: Var, axis: int, before: int, after: int) -> Var:
    """Zero-pad (positive) or crop (negative) one axis."""
    a = axis % x.type.rank
    if before < 0 or after < 0:
        stop = x.shape[a] + min(after, 0)
        x = b.emit("slice", x, axis=a, start=max(-before, 0), stop=stop)
        before, after = max(before, 0), max(after, 0)
    if before == 0 and after == 0:
        return x
    pads = [0] * (2 * x.type.rank)
    pads[2 * a], pads[2 * a + 1] = before, after
    return b.emit("pad", x, pads=tuple(pads))


def eye(b: ProgramBuilder, n: int, dtype: DType) -> Var:
    """The n x n identity: ones [n, 1] padded to [n, n+1], flattened, first n*n kept, reshaped."""
    ones = const(b, 1.0, dtype, (n, 1))
    wide = b.emit("pad", ones, pads=(0, 0, 0, n))
    flat = b.emit("reshape", wide, shape=(n * (n + 1),))
    return b.emit("reshape", b.emit("slice", flat, axis=0, start=0, stop=n * n), shape=(n, n))


def iota(b: ProgramBuilder, n: int, dtype: DType = DType.F32) -> Var:
    """[0, 1, ..., n-1] as floats (exact below 2^24 in f32), by doubling: iota(2m) = [iota(m), iota(m) + m]
    stacked with pad + add (no nested concats, which the planner's concat views do not nest)."""
    x = const(b, 0.0, dtype, (1, 1))
    m = 1
    while m < n:
        low = b.emit("pad", x, pads=(0, 1, 0, 0))
        high = b.emit("pad", b.emit("scalar_affine", x, scale=1.0, bias=float(m)), pads=(1, 0, 0, 0))
        x = b.emit("reshape", b.emit("add", low, high), shape=(1, 2 * m))
        m *= 2
    x = b.emit("reshape", x, shape=(m,))
    return x if m == n else b.emit("slice", x, axis=0, start=0, stop=n)


def one_hot(b: ProgramBuilder, idx: Var, n: int, dtype: DType) -> Var:
    """idx [...] (int) -> [idx.numel, n] of 0/1 in `dtype`."""
    flat = b.emit("reshape", idx, shape=(idx.type.numel, 1))
    ids = b.emit("cast", flat, dtype=DType.F32.value)
    hits = b.emit("equal", ids, b.emit("reshape", iota(b, n), shape=(1, n)))
    return mask_of(b, hits, dtype)


def transpose_last2(b: ProgramBuilder, x: Var) -> Var:
    perm = (*range(x.type.rank - 2), x.type.rank - 1, x.type.rank - 2)
    return b.emit("transpose", x, perm=perm)
