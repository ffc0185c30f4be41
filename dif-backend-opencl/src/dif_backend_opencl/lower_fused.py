"""Lowerings of the fused ops the optimizer makes (`dif.ops.fused`) onto `kernels/fused.cl`.

`FUSED_OPS` lists them; the device profile declares each as `op:<name>`, which is what lets the
passes (`dif.passes`) use them on this backend."""

from __future__ import annotations

import numpy as np

from dif.ir.program import Node
from dif_backend_opencl.lower import LowerCtx, Ref, at, broadcast_strides, lowers, strided_args
from dif_backend_opencl.lower_elementwise import lower_rope
from dif_backend_opencl.lower_nn import lower_rms_norm

FUSED = "fused"
FUSED_OPS: tuple[str, ...] = ("gated_residual", "norm_modulate", "rms_norm_rope")
MAX_LOCAL_HEAD_DIM = 1024
"""rms_norm_rope keeps one normalized row (head dim floats) in local memory up to this size; longer
rows run rms_norm then rope through scratch (same roundings, two launches)."""


def _bstrides(r: Ref, out_shape: tuple[int, ...]) -> tuple[int, ...]:
    return broadcast_strides(r.type.shape, out_shape)


@lowers("norm_modulate")
def lower_norm_modulate(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x, s, t), (y,) = ins, outs
    shape = y.type.shape
    length = shape[-1] if shape else 1
    extra = strided_args(shape, _bstrides(s, shape), _bstrides(t, shape))
    args = (*y.full(), *x.full(), *s.full(), *t.full(), np.int32(length), np.int32(at(node)["kind"] == "rms"),
            np.float32(at(node)["eps"]), *extra)  # fmt: skip
    ctx.launch_rows(FUSED, "norm_modulate", y.numel // max(length, 1), *args)


@lowers("gated_residual")
def lower_gated_residual(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x, g, v), (y,) = ins, outs
    shape = y.type.shape
    n = y.numel
    extra = strided_args(shape, _bstrides(x, shape), _bstrides(g, shape), _bstrides(v, shape))
    ctx.launch_1d(FUSED, "gated_residual", n, *y.full(), *x.full(), *g.full(), *v.full(), np.int64(n), *extra)


@lowers("rms_norm_rope")
def lower_rms_norm_rope(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x, w, cos, sin), (y,) = ins, outs
    _, s, h, d = x.type.shape
    a = at(node)
    if d > MAX_LOCAL_HEAD_DIM:  # the row does not fit in local memory: the unfused kernels via scratch
        normed = ctx.scratch(x.type.shape, x.dtype)
        lower_rms_norm(ctx, node, [x, w], [normed])
        lower_rope(ctx, node, [normed, cos, sin], [y])
        return
    dims = (np.int32(s), np.int32(h), np.int32(cos.type.shape[1]), np.int32(a["mode"] == "half"))
    args = (*y.full(), *x.full(), *w.full(), *cos.full(), *sin.full(), *dims, np.float32(a["eps"]),
            np.float32(a["offset"]), np.int32(a["round_before_weight"]))  # fmt: skip
    rows = x.numel // max(d, 1)
    ctx.launch(FUSED, "rms_norm_rope", (rows * ctx.row_group,), (ctx.row_group,), *args, defines={"HD": d})
