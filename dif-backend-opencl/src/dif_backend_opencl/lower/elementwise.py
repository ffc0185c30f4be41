"""OpenCL lowerings of `dif.ops.elementwise` (unary math, broadcasting binaries, compares, where, cast,
full) onto `kernels/elementwise.cl` and the fill kernels of `kernels/layout.cl`."""

from __future__ import annotations

import numpy as np

from dif.errors import NotImplementedOnBackend
from dif.ir.program import Node
from dif_backend_opencl.lower.base import (
    BACKEND,
    FLOATS,
    Attrs,
    LowerCtx,
    Ref,
    Refs,
    Steps,
    broadcast_strides,
    fill,
    fill_bits,
    lowers,
    strided_args,
)

EW = "elementwise"
UNARY: tuple[str, ...] = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "square")
UNARY += ("sin", "cos", "tanh", "sigmoid", "silu", "relu", "round")
INT_UNARY: tuple[str, ...] = ("neg", "abs")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow")
INT_BINARY = ("add", "sub", "mul", "maximum", "minimum")
COMPARE = ("less", "greater", "equal")


def unary(ctx: LowerCtx, kernel: str, y: Ref, x: Ref, p0: float = 0.0, p1: float = 0.0) -> Steps:
    """y = kernel(x) over floats, `p0` / `p1` the kernel's two scalar parameters."""
    n = y.numel
    return ctx.launch_1d(EW, f"un_{kernel}", n, *y.full(), *x.full(), np.int64(n), np.float32(p0), np.float32(p1))


@lowers(*UNARY)
def lower_unary(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    if x.dtype in FLOATS:
        return unary(ctx, node.op, y, x)
    if node.op in INT_UNARY:
        n = y.numel
        return ctx.launch_1d(EW, f"uni_{node.op}", n, *y.full(), *x.full(), np.int64(n))
    raise NotImplementedOnBackend(node.op, BACKEND, f"node {node.id}: integer {x.dtype.value} operand")


@lowers("gelu")
def lower_gelu(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    return unary(ctx, "gelu_tanh" if attrs["approximate"] == "tanh" else "gelu", outs[0], ins[0])


@lowers("clamp")
def lower_clamp(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    return unary(ctx, "clamp", outs[0], ins[0], attrs["lo"], attrs["hi"])


@lowers("scalar_affine")
def lower_affine(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    return unary(ctx, "affine", outs[0], ins[0], attrs["scale"], attrs["bias"])


@lowers("cast")
def lower_cast(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    n = y.numel
    if x.dtype == y.dtype:
        return ctx.copy(y, x)
    # fp8 counts as a float here: its stores round to nearest even like the others (kernels/common.cl)
    if y.dtype.is_float:  # any -> float: widen to fp32, round to nearest even on store
        return unary(ctx, "convert", y, x)
    if x.dtype.is_float:  # float -> int / bool: truncate toward zero
        return ctx.launch_1d(EW, "un_trunc", n, *y.full(), *x.full(), np.int64(n))
    return ctx.launch_1d(EW, "uni_convert", n, *y.full(), *x.full(), np.int64(n))


def bstrides(r: Ref, out_shape: tuple[int, ...]) -> list[int]:
    """Element strides of `r` read as the broadcast `out_shape`."""
    return broadcast_strides(r.type.shape, out_shape)


@lowers(*BINARY, *COMPARE)
def lower_binary(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (a, b), (y,) = ins, outs
    shape = y.type.shape
    if a.dtype in FLOATS:
        kernel = f"bin_{node.op}"
    elif node.op in INT_BINARY or node.op in COMPARE:
        kernel = f"bini_{node.op}"
    else:
        raise NotImplementedOnBackend(node.op, BACKEND, f"node {node.id}: integer {a.dtype.value} operands")
    n = y.numel
    extra = strided_args(shape, bstrides(a, shape), bstrides(b, shape))
    return ctx.launch_1d(EW, kernel, n, *y.full(), *a.full(), *b.full(), np.int64(n), *extra)


@lowers("where")
def lower_where(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (c, a, b), (y,) = ins, outs
    shape = y.type.shape
    n = y.numel
    extra = strided_args(shape, bstrides(c, shape), bstrides(a, shape), bstrides(b, shape))
    kernel = "where_f" if y.dtype in FLOATS else "where_i"
    return ctx.launch_1d(EW, kernel, n, *y.full(), *c.full(), *a.full(), *b.full(), np.int64(n), *extra)


@lowers("full")
def lower_full(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    y = outs[0]
    dt = y.dtype
    # the reference builds fp32 (float dtypes) or the int dtype itself, then casts to the result
    base = np.full((), attrs["value"], dtype=np.float32 if dt.is_float else dt.np)
    return fill(ctx, y, fill_bits(base, dt))
