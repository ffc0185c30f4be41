"""OpenCL lowerings of `dif.ops.norm`: the row kernels of `kernels/norm.cl` (rms_norm, layer_norm,
softmax, l2_normalize), group_norm (partial moments, merge, apply), and modulate / glu on
`kernels/elementwise.cl`."""

from __future__ import annotations

import numpy as np

from dif.ir.program import Node
from dif_backend_opencl.lower.base import (
    Attrs,
    LowerCtx,
    Ref,
    Refs,
    Steps,
    i32s,
    i64s,
    lowers,
    numel,
    strided_args,
)
from dif_backend_opencl.lower.elementwise import EW, bstrides

ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2}


@lowers("rms_norm")
def lower_rms_norm(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    x, y = ins[0], outs[0]
    w = ins[1] if len(ins) > 1 else None
    length = x.type.shape[-1]
    a = attrs
    args = (*y.full(), *x.full(), *(w or x).full(), np.int32(w is not None), np.int32(length),
            np.float32(a["eps"]), np.float32(a["offset"]), np.int32(a["round_before_weight"]))  # fmt: skip
    return ctx.launch_rows("norm", "rms_norm", x.numel // max(length, 1), *args)


@lowers("layer_norm")
def lower_layer_norm(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    x, y = ins[0], outs[0]
    w = ins[1] if len(ins) > 1 else None
    b = ins[2] if len(ins) > 2 else None
    length = x.type.shape[-1]
    args = (*y.full(), *x.full(), *(w or x).full(), *(b or x).full(), *i32s(w is not None, b is not None, length),
            np.float32(attrs["eps"]))  # fmt: skip
    return ctx.launch_rows("norm", "layer_norm", x.numel // max(length, 1), *args)


def group_norm(ctx: LowerCtx, y: Ref, x: Ref, w: Ref, b: Ref, groups: int, eps: float, silu: bool = False) -> Steps:
    """Normalize x[N, C, ...] per (image, channel group); optionally silu the result (fusion hook)."""
    n, c = x.type.shape[:2]
    spatial = numel(x.type.shape[2:])
    rows = n * groups
    length = (c // groups) * spatial
    parts = max(1, min(-(-length // 4096), -(-256 // max(rows, 1))))
    stats = ctx.scratch((rows * parts * 3,))
    ms = ctx.scratch((rows * 2,))
    gsize = (rows * parts * ctx.row_group,)
    steps = ctx.launch(
        "norm", "gn_partial", gsize, (ctx.row_group,), *stats.ptr(), *x.full(), np.int64(length), np.int32(parts)
    )
    steps += ctx.launch_1d("norm", "gn_merge", rows, *ms.ptr(), *stats.ptr(), *i32s(rows, parts), np.float32(eps))
    total = x.numel
    args = (*y.full(), *x.full(), *ms.ptr(), *w.full(), *b.full(), *i64s(total, length), *i32s(spatial, c, silu))
    return steps + ctx.launch_1d("norm", "gn_apply", total, *args)


@lowers("group_norm")
def lower_group_norm(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x, w, b), (y,) = ins, outs
    return group_norm(ctx, y, x, w, b, int(attrs["groups"]), float(attrs["eps"]))


def _axis_rows(x: Ref, axis: int) -> tuple[int, int, int]:
    shape = x.type.shape
    a = axis % max(len(shape), 1)
    outer, length, inner = numel(shape[:a]), shape[a] if shape else 1, numel(shape[a + 1 :])
    return outer, length, inner


@lowers("softmax")
def lower_softmax(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    outer, length, inner = _axis_rows(x, attrs["axis"])
    return ctx.launch_rows("norm", "softmax_axis", outer * inner, *y.full(), *x.full(), *i32s(length, inner))


@lowers("l2_normalize")
def lower_l2(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    outer, length, inner = _axis_rows(x, attrs["axis"])
    args = (*y.full(), *x.full(), *i32s(length, inner), np.float32(attrs["eps"]))
    return ctx.launch_rows("norm", "l2norm_axis", outer * inner, *args)


@lowers("modulate")
def lower_modulate(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x, s, t), (y,) = ins, outs
    shape = y.type.shape
    n = y.numel
    extra = strided_args(shape, bstrides(x, shape), bstrides(s, shape), bstrides(t, shape))
    return ctx.launch_1d(EW, "modulate", n, *y.full(), *x.full(), *s.full(), *t.full(), np.int64(n), *extra)


@lowers("glu")
def lower_glu(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    n, h = y.numel, y.type.shape[-1]
    first = np.int32(attrs["gated_half"] == "first")
    args = (*y.full(), *x.full(), np.int64(n), np.int32(h), np.int32(ACT_CODES[attrs["act"]]), first)
    return ctx.launch_1d(EW, "glu", n, *args)
