"""OpenCL lowerings of `dif.ops.fused`, the ops optimizer passes make, onto `kernels/fused.cl` (linear_add: onto
the linear's GEMM with the residual in its epilogue, `lower/linalg.py`). The backend
declares the fused ops of its lowering table as `op:<name>` (`LoweringTable.op_capabilities`), so
`dif.passes` fuses only what is lowered here."""

from __future__ import annotations

import numpy as np

from dif.ir.program import Node
from dif_backend_opencl.lower.attention import lower_rope
from dif_backend_opencl.lower.base import Attrs, LowerCtx, Refs, Steps, lowers, strided_args
from dif_backend_opencl.lower.elementwise import EW, bstrides, unary
from dif_backend_opencl.lower.linalg import linear
from dif_backend_opencl.lower.norm import lower_modulate, lower_rms_norm

FUSED = "fused"
MAX_LOCAL_HEAD_DIM = 1024
"""rms_norm_rope keeps one normalized row (head dim floats) in local memory up to this size; longer
rows run rms_norm then rope through scratch (same roundings, two launches)."""


@lowers("gated_residual")
def lower_gated_residual(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x, g, v), (y,) = ins, outs
    shape = y.type.shape
    n = y.numel
    extra = strided_args(shape, bstrides(x, shape), bstrides(g, shape), bstrides(v, shape))
    return ctx.launch_1d(FUSED, "gated_residual", n, *y.full(), *x.full(), *g.full(), *v.full(), np.int64(n), *extra)


@lowers("norm_modulate")
def lower_norm_modulate(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x, s, t), (y,) = ins, outs
    shape = y.type.shape
    length = shape[-1] if shape else 1
    extra = strided_args(shape, bstrides(s, shape), bstrides(t, shape))
    args = (*y.full(), *x.full(), *s.full(), *t.full(), np.int32(length), np.int32(attrs["kind"] == "rms"),
            np.float32(attrs["eps"]), *extra)  # fmt: skip
    return ctx.launch_rows(FUSED, "norm_modulate", y.numel // max(length, 1), *args)


@lowers("rms_norm_rope")
def lower_rms_norm_rope(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x, w, cos, sin), (y,) = ins, outs
    _, s, h, d = x.type.shape
    a = attrs
    if d > MAX_LOCAL_HEAD_DIM:  # the row does not fit in local memory: the unfused kernels via scratch
        normed = ctx.scratch(x.type.shape, x.dtype)
        steps = lower_rms_norm(ctx, node, attrs, [x, w], [normed])
        return steps + lower_rope(ctx, node, attrs, [normed, cos, sin], [y])
    dims = (np.int32(s), np.int32(h), np.int32(cos.type.shape[1]), np.int32(a["mode"] == "half"))
    args = (*y.full(), *x.full(), *w.full(), *cos.full(), *sin.full(), *dims, np.float32(a["eps"]),
            np.float32(a["offset"]), np.int32(a["round_before_weight"]))  # fmt: skip
    rows = x.numel // max(d, 1)
    return ctx.launch(FUSED, "rms_norm_rope", (rows * ctx.row_group,), (ctx.row_group,), *args, defines={"HD": d})


@lowers("linear_add")
def lower_linear_add(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    """r + linear(x, w, bias?) as one GEMM: the epilogue rounds the product to y's dtype (= x's, as the unfused
    linear stores it) and adds r, which has exactly y's shape, so the add costs no launch or pass of its own."""
    x, w, r = ins[:3]
    return linear(ctx, outs[0], x, w, ins[3] if len(ins) > 3 else None, residual=r)


@lowers("act_mul")
def lower_act_mul(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    """The activation into the result (rounded to its dtype, as the unfused op stores it), then the product with
    u in place."""
    (g, u), (y,) = ins, outs
    n = y.numel
    extra = strided_args(y.type.shape, bstrides(y, y.type.shape), bstrides(u, y.type.shape))
    mul = ctx.launch_1d(EW, "bin_mul", n, *y.full(), *y.full(), *u.full(), np.int64(n), *extra)
    return unary(ctx, attrs["act"], y, g) + mul


@lowers("rms_norm_modulate")
def lower_rms_norm_modulate(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    """The weighted rms_norm into scratch of x's dtype (rounded as the unfused op stores it), then modulate."""
    (x, w, sc, sh), (y,) = ins, outs
    normed = ctx.scratch(x.type.shape, x.dtype)
    norm = {"eps": attrs["eps"], "offset": attrs["offset"], "round_before_weight": False}
    return lower_rms_norm(ctx, node, norm, [x, w], [normed]) + lower_modulate(ctx, node, {}, [normed, sc, sh], [y])
