"""CUDA lowerings of `dif.ops.fused`, the ops optimizer passes make, onto `kernels/fused.cu` (`linear_add`: onto
the linear's GEMM, `lower/linalg.py`). The backend
declares the fused ops of its lowering table as `op:<name>` (`LoweringTable.op_capabilities`), so
`dif.passes` fuses only what is lowered here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dif.ir.program import Node
from dif.ops.quant import MAX_SHARED_NORMS
from dif_backend_cuda.lower.base import (
    FLOATS,
    ILP,
    THREADS,
    Attrs,
    DevTensor,
    Launch,
    LowerCtx,
    Steps,
    Ts,
    aligned,
    bcast_meta,
    broadcast_strides,
    chunk_broadcast,
    chunk_elements,
    f32,
    i64,
    lowering,
    need,
    ptr,
    row_groups,
    row_stride,
    row_threads,
    unsupported,
)

ROPE_ROWS = (8, 4)  # heads per warp of the rms_norm_rope_vec<RR> kernels, preferred first


WARP_CHUNKS = (4, 8, 12, 16, 20, 24)  # 16-byte chunks per lane of the norm_modulate_warp<N> kernels


@lowering("norm_modulate")
def _norm_modulate(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    return _norm_modulate_steps(ctx, node, ins, outs[0], attrs["eps"], attrs["kind"] == "rms")


@lowering("rms_norm_modulate")
def _rms_norm_modulate(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """norm_modulate's kernels with the norm's weight (kernels/fused.cu `rms_norm_modulate_*`)."""
    x, w, s, t = ins
    return _norm_modulate_steps(ctx, node, [x, s, t], outs[0], attrs["eps"], True, (w, attrs["offset"]))


def _norm_modulate_steps(
    ctx: LowerCtx, node: Node, ins: Ts, y: DevTensor, eps: float, is_rms: bool,
    weight: tuple[DevTensor, float] | None = None,
) -> Steps:  # fmt: skip
    """A warp per row where the row is 256 * N half-precision values (N in WARP_CHUNKS), a block per row holding
    it in registers where it is a multiple of 8 long, else the kernel that reads it twice; with `weight` (w,
    offset) their weighted forms, whose register and warp kernels also load the weight in 16-byte units."""
    x, s, t = ins
    dt = need(node, x.dtype, FLOATS)
    length = x.shape[-1]
    rows = x.numel // length
    lead = list(x.shape[:-1])
    ss, ts = broadcast_strides(s.shape, x.shape), broadcast_strides(t.shape, x.shape)
    meta = ctx.meta([len(lead), *lead, *ss[:-1], *ts[:-1]])
    prefix, tail, wide = "norm_modulate", [], [x, s, t, y]
    if weight is not None:
        w, offset = weight
        prefix, tail, dt = "rms_norm_modulate", [ptr(w), f32(offset)], f"{dt}_{need(node, w.dtype, FLOATS)}"
        wide.append(w)
    common = [f32(eps), np.int32(is_rms), *tail]
    per = chunk_elements(x, s, t, y)  # values per 16-byte load, when all four allow those loads
    chunks = length // (32 * per) if per and length % (32 * per) == 0 else 0
    weights_fit = weight is None or (per > 0 and weight[0].ptr % (per * weight[0].dtype.itemsize) == 0)
    if ss[-1] == ts[-1] == 1 and chunks in WARP_CHUNKS and weights_fit:
        warps = THREADS // 32
        args = [ptr(x), ptr(s), ptr(t), ptr(y), meta, i64(rows), *common]
        return [ctx.kernel("fused", f"{prefix}_warp{chunks}_{dt}", (-(-rows // warps),), (THREADS,), args)]
    if ss[-1] == ts[-1] == 1 and length % 8 == 0 and length <= 8 * 1024 and aligned(4, *wide):
        args = [ptr(x), ptr(s), ptr(t), ptr(y), meta, i64(length), *common]
        # 16 values per thread on long rows: half the threads, twice the bytes each in flight (the kernel
        # is latency-bound: one row per block, two block reductions)
        vpt, name = (16, "vec16") if length % 16 == 0 and length >= 16 * 128 else (8, "vec")
        block = -(-length // vpt // 32) * 32
        return [ctx.kernel("fused", f"{prefix}_{name}_{dt}", (rows,), (block,), args)]
    args = [ptr(x), ptr(s), ptr(t), ptr(y), meta, i64(length), i64(ss[-1]), i64(ts[-1]), *common]
    block = min(1024, max(row_threads(length), -(-length // 8 // 32) * 32))
    return [ctx.kernel("fused", f"{prefix}_{dt}", (rows,), (block,), args)]


@lowering("gated_residual")
def _gated_residual(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, g, u), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    if g.shape == y.shape and u.shape != y.shape:  # gate * y is symmetric: put the broadcast one second
        g, u = u, g
    groups = row_groups(g.shape, y.shape)
    d = y.shape[-1] if y.shape else 1
    if x.shape == u.shape == y.shape and groups and d % 4 == 0 and aligned(4, x, g, u, y):
        rows = y.numel // d
        n4 = y.numel // 4
        args = [ptr(x), ptr(g), ptr(u), ptr(y), i64(n4), i64(d), i64(rows // groups)]
        return [ctx.flat("fused", f"gated_residual_rows_{dt}", n4 * ILP, args)]
    cb = chunk_broadcast(ctx, [x, g, u], y)
    if cb is not None:  # a gate [S, 1, D] over heads [B, S, H, D] (rope's VJP), or a scalar per row
        args = [ptr(x), ptr(g), ptr(u), ptr(y), cb.meta, i64(cb.chunks), np.int32(cb.scalars)]
        return [ctx.flat("fused", f"gated_residual_bvec_{dt}", cb.chunks, args)]
    meta = bcast_meta(ctx, [x, g, u], y)
    return [ctx.flat("fused", f"gated_residual_{dt}", y.numel, [ptr(x), ptr(g), ptr(u), ptr(y), meta, i64(y.numel)])]


@lowering("act_mul")
def _act_mul(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """One pass over g and u (kernels/fused.cu): 16-byte chunks where all three are contiguous, aligned and
    whole chunks, else one element a thread."""
    (g, u), (y,) = ins, outs
    name = f"{attrs['act']}_{need(node, g.dtype, FLOATS)}"
    per = chunk_elements(g, u, y)
    n = y.numel // per if per else y.numel
    return [ctx.flat("fused", f"act_mul_vec_{name}" if per else f"act_mul_{name}", n, [ptr(g), ptr(u), ptr(y), i64(n)])]


@lowering("rms_norm_rope")
def _rms_norm_rope(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    no_bound = [np.uint64(0)] * MAX_SHARED_NORMS  # the quantizing form's b1..b3 and scale pointers, null here
    return [norm_rope_kernel(ctx, node, attrs, ins, outs[0], "rms_norm_rope", no_bound)]


def norm_rope_kernel(
    ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, y: DevTensor, kernel: str, tail: list[Any]
) -> Launch:
    """The launch of `kernel` (rms_norm_rope or its quantizing form) over x, w, cos, sin into y, with `tail`
    (the bound weights and the scale's pointer, null for the plain form) after the common arguments: the
    register kernel of 128-channel heads where the shapes allow, else the warp-per-row one."""
    x, w, c, s = ins
    dt = need(node, x.dtype, FLOATS)
    wt = need(node, w.dtype, FLOATS)
    if c.dtype != s.dtype:
        raise unsupported(node, f"cos {c.dtype.value} and sin {s.dtype.value} differ in dtype")
    ct = need(node, c.dtype, FLOATS)
    _b, seq, heads, dim = x.shape
    rows = x.numel // dim
    rot = c.shape[1]
    xt, yt = row_stride(node, x, 2), row_stride(node, y, 2)
    warps = THREADS // 32
    pairs = attrs["mode"] == "pairs"
    common = [f32(attrs["eps"]), f32(attrs["offset"]), np.int32(attrs["round_before_weight"]), np.int32(pairs)]
    per_warp = next((r for r in ROPE_ROWS if heads % r == 0), 0)
    fits = dim == 128 and per_warp and rows < 2**31 and xt % 4 == 0 and yt % 4 == 0
    if fits and (rot % 4 == 0 if pairs else rot == 128) and aligned(4, x, y):
        args = [ptr(x), ptr(w), ptr(c), ptr(s), ptr(y), i64(rows), i64(seq), i64(heads), i64(rot), *common]
        grid = (-(-rows // (warps * per_warp)),)
        name = f"{kernel}_vec{per_warp}_{dt}_{wt}_{ct}"
        return ctx.kernel("fused", name, grid, (THREADS,), [*args, i64(xt), i64(yt), *tail])
    shared = warps * dim * 4
    if shared > 48 * 1024:
        raise unsupported(node, f"head dim {dim} needs {shared} B of shared memory per block")
    args = [ptr(x), ptr(w), ptr(c), ptr(s), ptr(y), i64(rows), i64(seq), i64(heads), i64(dim), i64(rot), *common]
    grid = (-(-rows // warps),)
    return ctx.kernel("fused", f"{kernel}_{dt}_{wt}_{ct}", grid, (THREADS,), [*args, i64(xt), i64(yt), *tail], shared)


@lowering("linear_add")
def _linear_add(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """linear_add(x, w, r, bias?) = x @ w^T + bias + r (`fuse_linear_residual`): the linear's cuBLASLt GEMM with
    r, of y's shape and dtype, as C and beta 1, so the residual add costs no launch of its own; without
    cuBLASLt the NVRTC GEMM and the add kernel (`lower/linalg.py`)."""
    from dif_backend_cuda.lower.linalg import linear_steps

    bias = ins[3] if len(ins) > 3 else None
    return linear_steps(ctx, node, ins[0], ins[1], bias, outs[0], residual=ins[2])
