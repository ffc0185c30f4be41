"""Lowering of the fused ops that optimizer passes make (`dif.ops.fused`) to `kernels/fused.cu`.

The backend advertises them as `op:<name>` capabilities, so `dif.passes` only fuses what is here.
"""

from __future__ import annotations

import numpy as np

from dif.ir.program import Node
from dif_backend_cuda.lower import (
    FLOATS,
    THREADS,
    Attrs,
    LowerCtx,
    Steps,
    Ts,
    _bcast,
    broadcast_strides,
    f32,
    i64,
    lowering,
    need,
    ptr,
    row_threads,
    unsupported,
)

FUSED_OPS = ("norm_modulate", "gated_residual", "rms_norm_rope")


@lowering("norm_modulate")
def _norm_modulate(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, s, t), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    length = x.shape[-1]
    rows = x.numel // length
    lead = list(x.shape[:-1])
    ss, ts = broadcast_strides(s.shape, x.shape), broadcast_strides(t.shape, x.shape)
    meta = ctx.meta([len(lead), *lead, *ss[:-1], *ts[:-1]])
    args = [
        ptr(x), ptr(s), ptr(t), ptr(y), meta, i64(length), i64(ss[-1]), i64(ts[-1]),
        f32(attrs["eps"]), np.int32(attrs["kind"] == "rms"),
    ]  # fmt: skip
    block = min(1024, max(row_threads(length), -(-length // 8 // 32) * 32))
    return [ctx.kernel("fused", f"norm_modulate_{dt}", (rows,), (block,), args)]


@lowering("gated_residual")
def _gated_residual(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, g, u), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    meta = _bcast(ctx, [x, g, u], y)
    return [ctx.flat("fused", f"gated_residual_{dt}", y.numel, [ptr(x), ptr(g), ptr(u), ptr(y), meta, i64(y.numel)])]


@lowering("rms_norm_rope")
def _rms_norm_rope(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, w, c, s), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    wt = need(node, w.dtype, FLOATS)
    if c.dtype != s.dtype:
        raise unsupported(node, f"cos {c.dtype.value} and sin {s.dtype.value} differ in dtype")
    ct = need(node, c.dtype, FLOATS)
    _b, seq, heads, dim = x.shape
    rows = x.numel // dim
    warps = THREADS // 32
    shared = warps * dim * 4
    if shared > 48 * 1024:
        raise unsupported(node, f"head dim {dim} needs {shared} B of shared memory per block")
    args = [
        ptr(x), ptr(w), ptr(c), ptr(s), ptr(y), i64(rows), i64(seq), i64(heads), i64(dim), i64(c.shape[1]),
        f32(attrs["eps"]), f32(attrs["offset"]), np.int32(attrs["round_before_weight"]),
        np.int32(attrs["mode"] == "pairs"),
    ]  # fmt: skip
    grid = (-(-rows // warps),)
    return [ctx.kernel("fused", f"rms_norm_rope_{dt}_{wt}_{ct}", grid, (THREADS,), args, shared)]
