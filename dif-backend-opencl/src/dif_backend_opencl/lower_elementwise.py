"""Lowerings of elementwise ops (unary math, broadcasting binaries, compares, where, cast, full,
modulate, glu, rope) onto `kernels/elementwise.cl` and the fill kernels of `kernels/layout.cl`."""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.errors import NotImplementedOnBackend
from dif.ir.program import Node
from dif_backend_opencl.lower import (
    BACKEND,
    FLOATS,
    LowerCtx,
    Ref,
    at,
    broadcast_strides,
    lowers,
    strided_args,
)

EW = "elementwise"
UNARY: tuple[str, ...] = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "square")
UNARY += ("sin", "cos", "tanh", "sigmoid", "silu", "relu")
INT_UNARY: tuple[str, ...] = ("neg", "abs")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow")
INT_BINARY = ("add", "sub", "mul", "maximum", "minimum")
COMPARE = ("less", "greater", "equal")
ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2}


def _unary(ctx: LowerCtx, kernel: str, y: Ref, x: Ref, p0: float = 0.0, p1: float = 0.0) -> None:
    n = y.numel
    ctx.launch_1d(EW, f"un_{kernel}", n, *y.full(), *x.full(), np.int64(n), np.float32(p0), np.float32(p1))


@lowers(*UNARY)
def lower_unary(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    if x.dtype in FLOATS:
        _unary(ctx, node.op, y, x)
    elif node.op in INT_UNARY:
        n = y.numel
        ctx.launch_1d(EW, f"uni_{node.op}", n, *y.full(), *x.full(), np.int64(n))
    else:
        raise NotImplementedOnBackend(node.op, BACKEND, f"node {node.id}: integer {x.dtype.value} operand")


@lowers("gelu")
def lower_gelu(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    _unary(ctx, "gelu_tanh" if at(node)["approximate"] == "tanh" else "gelu", outs[0], ins[0])


@lowers("clamp")
def lower_clamp(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    _unary(ctx, "clamp", outs[0], ins[0], at(node)["lo"], at(node)["hi"])


@lowers("scalar_affine")
def lower_affine(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    _unary(ctx, "affine", outs[0], ins[0], at(node)["scale"], at(node)["bias"])


@lowers("cast")
def lower_cast(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    n = y.numel
    if x.dtype == y.dtype:
        ctx.copy(y, x)
    elif y.dtype in FLOATS:  # any -> float: widen to fp32, round to nearest even on store
        _unary(ctx, "convert", y, x)
    elif x.dtype in FLOATS:  # float -> int / bool: truncate toward zero
        ctx.launch_1d(EW, "un_trunc", n, *y.full(), *x.full(), np.int64(n))
    else:
        ctx.launch_1d(EW, "uni_convert", n, *y.full(), *x.full(), np.int64(n))


def _bstrides(r: Ref, out_shape: tuple[int, ...]) -> tuple[int, ...]:
    return broadcast_strides(r.type.shape, out_shape)


@lowers(*BINARY, *COMPARE)
def lower_binary(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (a, b), (y,) = ins, outs
    shape = y.type.shape
    if a.dtype in FLOATS:
        kernel = f"bin_{node.op}"
    elif node.op in INT_BINARY or node.op in COMPARE:
        kernel = f"bini_{node.op}"
    else:
        raise NotImplementedOnBackend(node.op, BACKEND, f"node {node.id}: integer {a.dtype.value} operands")
    n = y.numel
    extra = strided_args(shape, _bstrides(a, shape), _bstrides(b, shape))
    ctx.launch_1d(EW, kernel, n, *y.full(), *a.full(), *b.full(), np.int64(n), *extra)


@lowers("where")
def lower_where(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (c, a, b), (y,) = ins, outs
    shape = y.type.shape
    n = y.numel
    extra = strided_args(shape, _bstrides(c, shape), _bstrides(a, shape), _bstrides(b, shape))
    kernel = "where_f" if y.dtype in FLOATS else "where_i"
    ctx.launch_1d(EW, kernel, n, *y.full(), *c.full(), *a.full(), *b.full(), np.int64(n), *extra)


@lowers("modulate")
def lower_modulate(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x, s, t), (y,) = ins, outs
    shape = y.type.shape
    n = y.numel
    extra = strided_args(shape, _bstrides(x, shape), _bstrides(s, shape), _bstrides(t, shape))
    ctx.launch_1d(EW, "modulate", n, *y.full(), *x.full(), *s.full(), *t.full(), np.int64(n), *extra)


def fill_bits(value: float | np.ndarray, dtype: DType) -> tuple[int, np.uint64]:
    """(element size, raw bits) of `value` stored as `dtype`, converted the way numpy does."""
    arr = np.asarray(value).astype(dtype.np).reshape(1)
    size = dtype.itemsize
    raw = arr.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size])[0]
    return size, np.uint64(int(raw))


def fill(ctx: LowerCtx, y: Ref, bits: tuple[int, np.uint64]) -> None:
    size, raw = bits
    n = y.numel
    ctx.launch_1d("layout", f"fill{size}", n, *y.ptr(), np.int64(n), raw)


@lowers("full")
def lower_full(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    y = outs[0]
    dt = y.dtype
    # the reference builds fp32 (float dtypes) or the int dtype itself, then casts to the result
    base = np.full((), at(node)["value"], dtype=np.float32 if dt.is_float else dt.np)
    fill(ctx, y, fill_bits(base, dt))


@lowers("glu")
def lower_glu(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    n, h = y.numel, y.type.shape[-1]
    first = np.int32(at(node)["gated_half"] == "first")
    args = (*y.full(), *x.full(), np.int64(n), np.int32(h), np.int32(ACT_CODES[at(node)["act"]]), first)
    ctx.launch_1d(EW, "glu", n, *args)


@lowers("rope")
def lower_rope(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x, cos, sin), (y,) = ins, outs
    _, s, h, d = x.type.shape
    r = cos.type.shape[1]
    n = y.numel
    half = np.int32(at(node)["mode"] == "half")
    dims = (np.int32(s), np.int32(h), np.int32(d), np.int32(r), half)
    ctx.launch_1d(EW, "rope", n, *y.full(), *x.full(), *cos.full(), *sin.full(), np.int64(n), *dims)
