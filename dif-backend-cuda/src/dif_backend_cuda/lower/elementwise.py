"""CUDA lowerings of `dif.ops.elementwise` (unary math, broadcasting binaries, compares, where, cast,
full) onto `kernels/elementwise.cu` and the fill kernels of `kernels/layout.cu`."""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.ir.program import Node
from dif_backend_cuda.lower.base import (
    FLOATS,
    INTS,
    Attrs,
    Copy,
    LowerCtx,
    Steps,
    Ts,
    bcast_meta,
    bits,
    chunk_broadcast,
    chunk_elements,
    f32,
    fill_steps,
    i64,
    lowering,
    need,
    ptr,
    unsupported,
)

UNARY = (
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "silu",
    "relu",
    "reciprocal",
    "square",
    "gelu",
    "clamp",
    "scalar_affine",
    "round",
)


@lowering(*UNARY)
def _unary(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    name = node.op
    p0 = p1 = 0.0
    if name == "gelu" and attrs["approximate"] == "tanh":
        name = "gelu_tanh"
    elif name == "clamp":
        p0, p1 = attrs["lo"], attrs["hi"]
    elif name == "scalar_affine":
        p0, p1 = attrs["scale"], attrs["bias"]
    dt = need(node, x.dtype, FLOATS)
    per = chunk_elements(x, y)
    if per:
        chunks = y.numel // per
        return [ctx.flat("elementwise", f"unary_vec_{name}_{dt}", chunks, [ptr(x), ptr(y), i64(chunks), f32(p0),
                                                                             f32(p1)])]  # fmt: skip
    return [ctx.flat("elementwise", f"unary_{name}_{dt}", y.numel, [ptr(x), ptr(y), i64(y.numel), f32(p0), f32(p1)])]


@lowering("add", "sub", "mul", "div", "maximum", "minimum", "pow")
def _binary(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (a, b), (y,) = ins, outs
    allowed = FLOATS + (INTS if node.op in ("add", "sub", "mul", "maximum", "minimum") else ())
    dt = need(node, a.dtype, allowed)
    per = chunk_elements(a, b, y) if a.shape == b.shape == y.shape and a.dtype in FLOATS else 0
    if per:
        chunks = y.numel // per
        return [ctx.flat("elementwise", f"binary_vec_{node.op}_{dt}", chunks, [ptr(a), ptr(b), ptr(y), i64(chunks)])]
    cb = chunk_broadcast(ctx, [a, b], y) if a.dtype in FLOATS else None
    if cb is not None:
        args = [ptr(a), ptr(b), ptr(y), cb.meta, i64(cb.chunks), np.int32(cb.scalars)]
        return [ctx.flat("elementwise", f"binary_bvec_{node.op}_{dt}", cb.chunks, args)]
    meta = bcast_meta(ctx, [a, b], y)
    return [ctx.flat("elementwise", f"binary_{node.op}_{dt}", y.numel, [ptr(a), ptr(b), ptr(y), meta, i64(y.numel)])]


@lowering("less", "greater", "equal")
def _compare(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (a, b), (y,) = ins, outs
    dt = need(node, a.dtype, FLOATS + INTS)
    meta = bcast_meta(ctx, [a, b], y)
    return [ctx.flat("elementwise", f"compare_{node.op}_{dt}", y.numel, [ptr(a), ptr(b), ptr(y), meta, i64(y.numel)])]


@lowering("where")
def _where(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (c, a, b), (y,) = ins, outs
    meta = bcast_meta(ctx, [c, a, b], y)
    args = [ptr(c), ptr(a), ptr(b), ptr(y), meta, i64(y.numel)]
    return [ctx.flat("elementwise", f"where_u{bits(y)}", y.numel, args)]


@lowering("cast")
def _cast(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    if x.dtype == y.dtype:
        return [Copy(y.ptr, x.ptr, y.nbytes)]
    if ctx.backend.props["major"] * 10 + ctx.backend.props["minor"] < 89 and {x.dtype, y.dtype} & {
        DType.F8E4M3,
        DType.F8E5M2,
    }:
        raise unsupported(node, "fp8 conversion needs compute capability 8.9+")
    return [ctx.flat("elementwise", f"cast_{x.dtype.value}_{y.dtype.value}", y.numel, [ptr(x), ptr(y), i64(y.numel)])]


@lowering("full")
def _full(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (y,) = outs
    value = ctx.table.get("full").run_reference([], attrs)[0]  # the op's own meaning of `value`
    return fill_steps(ctx, y, np.asarray(value).reshape(-1)[:1])
