"""CUDA lowerings of `dif.ops.norm`: rms_norm, layer_norm and their backwards, group_norm, softmax,
l2_normalize onto `kernels/norm.cu` (row kernels); modulate, glu and its backward onto
`kernels/elementwise.cu`."""

from __future__ import annotations

import math

import numpy as np

from dif.ir.program import Node
from dif_backend_cuda.lower.base import (
    FLOATS,
    ILP,
    THREADS,
    Attrs,
    DevTensor,
    LowerCtx,
    Steps,
    Ts,
    bcast_meta,
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

ROW_VPT = 8  # row values a thread keeps in registers (ROW_VPT in kernels/norm.cu)


GROUP_SPANS = (16384, 8192, 4096)  # values per slice of a split group_norm (a slice divides the spatial size)


def _norm_launch(length: int, rows: int) -> tuple[tuple[int], tuple[int], np.int32]:
    """(grid, block, warp_rows): a warp per row for short rows, else a block per row sized so each
    thread holds at most ROW_VPT values."""
    if length <= ROW_VPT * 32:
        per_block = THREADS // 32
        return (-(-rows // per_block),), (THREADS,), np.int32(per_block)
    threads = int(min(1024, max(32, -(-length // ROW_VPT // 32) * 32)))
    return (rows,), (threads,), np.int32(0)


@lowering("rms_norm")
def _rms(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    x, w = ins[0], (ins[1] if len(ins) > 1 else None)
    (y,) = outs
    dt = need(node, x.dtype, FLOATS)
    wt = need(node, w.dtype, FLOATS) if w is not None else dt
    length = x.shape[-1]
    rows = x.numel // length
    grid, block, warp_rows = _norm_launch(length, rows)
    align = 4 * x.dtype.itemsize
    vec4 = bool(warp_rows) and length % 128 == 0 and x.ptr % align == 0 and y.ptr % align == 0
    args = [
        ptr(x),
        ptr(w),
        ptr(y),
        i64(rows),
        i64(length),
        f32(attrs["eps"]),
        f32(attrs["offset"]),
        np.int32(attrs["round_before_weight"]),
        warp_rows,
        np.int32(vec4),
    ]
    return [ctx.kernel("norm", f"rms_norm_{dt}_{wt}", grid, block, args)]


@lowering("rms_norm_backward", "layer_norm_backward")
def _norm_backward(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """Both on one row kernel (its CENTRED template argument), launched as the forward norms are."""
    x, g, w = ins[0], ins[1], (ins[2] if len(ins) > 2 else None)
    (dx,) = outs
    dt = need(node, x.dtype, FLOATS)
    wt = need(node, w.dtype, FLOATS) if w is not None else dt
    length = x.shape[-1]
    rows = x.numel // length
    grid, block, warp_rows = _norm_launch(length, rows)
    offset = f32(attrs.get("offset", 0.0))
    args = [ptr(x), ptr(g), ptr(w), ptr(dx), i64(rows), i64(length), f32(attrs["eps"]), offset, warp_rows]
    return [ctx.kernel("norm", f"{node.op}_{dt}_{wt}", grid, block, args)]


@lowering("layer_norm")
def _layer(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    x = ins[0]
    w = ins[1] if len(ins) > 1 else None
    b = ins[2] if len(ins) > 2 else None
    (y,) = outs
    dt = need(node, x.dtype, FLOATS)
    if w is not None and b is not None and w.dtype != b.dtype:
        raise unsupported(node, f"weight {w.dtype.value} and bias {b.dtype.value} differ in dtype")
    p = w if w is not None else b
    wt = need(node, p.dtype, FLOATS) if p is not None else dt
    length = x.shape[-1]
    rows = x.numel // length
    grid, block, warp_rows = _norm_launch(length, rows)
    args = [ptr(x), ptr(w), ptr(b), ptr(y), i64(rows), i64(length), f32(attrs["eps"]), warp_rows]
    return [ctx.kernel("norm", f"layer_norm_{dt}_{wt}", grid, block, args)]


@lowering("group_norm")
def _group(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    return group_norm_steps(ctx, node, attrs, ins, outs, "group_norm")


def group_norm_steps(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts, kernel: str) -> Steps:
    """group_norm's launches with kernels `{kernel}_*` of norm.cu ("group_norm", or "group_norm_silu" for
    `dif.ops.norm_act`: the same kernels with the SiLU applied on the way out)."""
    (x, w, b), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    if w.dtype != b.dtype:
        raise unsupported(node, f"weight {w.dtype.value} and bias {b.dtype.value} differ in dtype")
    wt = need(node, w.dtype, FLOATS)
    n, c = x.shape[:2]
    spatial = math.prod(x.shape[2:])
    g = attrs["groups"]
    span = next((v for v in GROUP_SPANS if spatial % v == 0), 0)
    if span and n * g < 4 * ctx.sm_count and c // g * spatial >= 2 * span and chunk_elements(x, y):
        # too few groups to fill the GPU with a block each: slices of `span` values, two passes
        import cupy

        slices = c // g * spatial // span
        part = cupy.cuda.Memory(n * g * slices * 2 * 4)  # (mean, M2) per slice, owned by the stats step
        grid = (n * g, slices)
        stats = ctx.kernel("norm", f"group_norm_stats_{dt}", grid, (THREADS,), [ptr(x), np.uint64(part.ptr), i64(span)])
        stats.scratch = part
        args = [ptr(x), ptr(w), ptr(b), np.uint64(part.ptr), ptr(y), i64(c), i64(spatial), i64(g), i64(span)]
        return [stats, ctx.kernel("norm", f"{kernel}_apply_{dt}_{wt}", grid, (THREADS,), [*args, f32(attrs["eps"])])]
    args = [ptr(x), ptr(w), ptr(b), ptr(y), i64(c), i64(spatial), i64(g), f32(attrs["eps"])]
    return [ctx.kernel("norm", f"{kernel}_{dt}_{wt}", (n * g,), (row_threads(c // g * spatial),), args)]


def _axis_rows(x: DevTensor, axis: int) -> tuple[int, int, int]:
    a = axis % len(x.shape)
    return math.prod(x.shape[:a]), x.shape[a], math.prod(x.shape[a + 1 :])


@lowering("softmax")
def _softmax(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    outer, length, inner = _axis_rows(x, attrs["axis"])
    args = [ptr(x), ptr(y), i64(length), i64(inner)]
    return [ctx.kernel("norm", f"softmax_{dt}", (outer * inner,), (row_threads(length),), args)]


@lowering("l2_normalize")
def _l2(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    outer, length, inner = _axis_rows(x, attrs["axis"])
    args = [ptr(x), ptr(y), i64(length), i64(inner), f32(attrs["eps"])]
    return [ctx.kernel("norm", f"l2_normalize_{dt}", (outer * inner,), (row_threads(length),), args)]


@lowering("modulate")
def _modulate(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, s, t), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    groups = row_groups(s.shape, y.shape) if s.shape == t.shape and x.shape == y.shape else 0
    per = chunk_elements(x, s, t, y) if groups else 0
    if per and y.shape[-1] % per == 0:
        chunks, dc = y.numel // per, y.shape[-1] // per
        rows_per_g = y.numel // y.shape[-1] // groups
        args = [ptr(x), ptr(s), ptr(t), ptr(y), i64(chunks), i64(dc), i64(rows_per_g)]
        return [ctx.flat("elementwise", f"modulate_rows_{dt}", chunks, args)]
    meta = bcast_meta(ctx, [x, s, t], y)
    args = [ptr(x), ptr(s), ptr(t), ptr(y), meta, i64(y.numel)]
    return [ctx.flat("elementwise", f"modulate_{dt}", y.numel, args)]


@lowering("glu", "glu_backward")
def _glu(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """glu: x [rows, 2h] -> y [rows, h]; glu_backward: (x, g [rows, h]) -> dx [rows, 2h]. Both walk rows of
    h columns, 8 columns per thread through vector loads where h, every row pitch and every pointer allow."""
    tensors = (*ins, *outs)
    x = ins[0]
    dt = need(node, x.dtype, FLOATS)
    h = x.shape[-1] // 2
    rows = x.numel // x.shape[-1]
    pitches = [row_stride(node, t, 1) for t in tensors]
    first = np.int32(1 if attrs["gated_half"] == "first" else 0)
    args = [*map(ptr, tensors), i64(rows), i64(h), first, *map(i64, pitches)]
    size = x.dtype.itemsize
    if h % 8 == 0 and all(p % 4 == 0 for p in pitches) and all(t.ptr % (4 * size) == 0 for t in tensors):
        grid = (-(-h // (8 * THREADS)), max(1, min(rows, 65535)))
        return [ctx.kernel("elementwise", f"{node.op}_vec_{attrs['act']}_{dt}", grid, (THREADS,), args)]
    grid = (max(1, min(-(-h // (THREADS * ILP)), 64)), max(1, min(rows, 65535)))
    return [ctx.kernel("elementwise", f"{node.op}_{attrs['act']}_{dt}", grid, (THREADS,), args)]
