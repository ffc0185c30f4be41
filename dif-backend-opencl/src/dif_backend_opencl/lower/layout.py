"""OpenCL lowerings of `dif.ops.layout` (reshape, transpose, slice, split, concat, broadcast_to, pad, take,
embedding) onto the element-size-typed kernels of `kernels/layout.cl`.

Everything is one strided copy (`copy{1,2,4,8}`) from a view of the source to a view of the
result, except pad and take; a copy that is contiguous on both sides is a plain buffer copy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.ir.program import Node
from dif_backend_opencl.lower.base import (
    Attrs,
    LowerCtx,
    Ref,
    Refs,
    Steps,
    broadcast_strides,
    collapse,
    contiguous_strides,
    fill_bits,
    lowers,
    numel,
    vec8,
)

LAYOUT = "layout"


def strided_copy(
    ctx: LowerCtx, dst: Ref, dst_strides: Sequence[int], src: Ref, src_strides: Sequence[int], shape: Sequence[int]
) -> Steps:
    """dst[view] = src[view], both views of `shape` with the given element strides."""
    n = numel(shape)
    if n == 0:
        return []
    cshape, (ds, ss) = collapse(shape, [dst_strides, src_strides])
    contig = contiguous_strides(cshape)
    if n == 1 or ds == ss == contig:  # one element, or contiguous on both sides: a plain buffer copy
        return ctx.copy(dst.view(0, (n,)), src.view(0, (n,)))
    flat = (1 if ds == contig else 0) | (2 if ss == contig else 0)
    size = dst.dtype.itemsize
    args = (*dst.ptr(), *src.ptr(), np.int64(n), vec8(cshape, 1), vec8(ds, 0), vec8(ss, 0), np.int32(flat))
    return ctx.launch_1d(LAYOUT, f"copy{size}", n, *args)


def _axis(attrs: Attrs, rank: int) -> int:
    return int(attrs["axis"]) % max(rank, 1)


@lowers("reshape")
def lower_reshape(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    return ctx.copy(outs[0], ins[0])  # an unaliased result has its own slot (aliased reshapes are never lowered)


@lowers("transpose")
def lower_transpose(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    xs = contiguous_strides(x.type.shape)
    perm = attrs["perm"]
    return strided_copy(ctx, y, contiguous_strides(y.type.shape), x, [xs[p] for p in perm], y.type.shape)


@lowers("broadcast_to")
def lower_broadcast(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    shape = y.type.shape
    return strided_copy(ctx, y, contiguous_strides(shape), x, broadcast_strides(x.type.shape, shape), shape)


@lowers("slice")
def lower_slice(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    a = _axis(attrs, x.type.rank)
    start, _, step = slice(attrs["start"], attrs["stop"], attrs["step"]).indices(x.type.shape[a])
    xs = list(contiguous_strides(x.type.shape))
    src = x.view(start * xs[a])
    xs[a] *= step
    return strided_copy(ctx, y, contiguous_strides(y.type.shape), src, xs, y.type.shape)


@lowers("split")
def lower_split(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,) = ins
    a = _axis(attrs, x.type.rank)
    xs = contiguous_strides(x.type.shape)
    start = 0
    steps: Steps = []
    for y in outs:
        steps += strided_copy(ctx, y, contiguous_strides(y.type.shape), x.view(start * xs[a]), xs, y.type.shape)
        start += y.type.shape[a]
    return steps


@lowers("concat")
def lower_concat(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (y,) = outs
    a = _axis(attrs, y.type.rank)
    ys = contiguous_strides(y.type.shape)
    start = 0
    steps: Steps = []
    for x in ins:
        steps += strided_copy(ctx, y.view(start * ys[a]), ys, x, contiguous_strides(x.type.shape), x.type.shape)
        start += x.type.shape[a]
    return steps


@lowers("pad")
def lower_pad(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    pads = attrs["pads"]
    n = y.numel
    size, bits = fill_bits(attrs["value"], x.dtype)
    mode = np.int32(attrs["mode"] == "reflect")
    before = [pads[2 * i] for i in range(x.type.rank)]
    args = (*y.ptr(), *x.ptr(), np.int64(n), vec8(y.type.shape, 1), vec8(x.type.shape, 1), vec8(before, 0), mode, bits)
    return ctx.launch_1d(LAYOUT, f"pad{size}", n, *args)


def _take(ctx: LowerCtx, y: Ref, x: Ref, idx: Ref, axis: int) -> Steps:
    shape = x.type.shape
    inner = numel(shape[axis + 1 :])
    n = y.numel
    size = x.dtype.itemsize
    dims = (np.int32(shape[axis]), np.int32(idx.numel), np.int32(inner))
    return ctx.launch_1d(LAYOUT, f"take{size}", n, *y.ptr(), *x.ptr(), *idx.full(), np.int64(n), *dims)


@lowers("take")
def lower_take(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x, idx), (y,) = ins, outs
    return _take(ctx, y, x, idx, _axis(attrs, x.type.rank))


@lowers("embedding")
def lower_embedding(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (ids, table), (y,) = ins, outs
    return _take(ctx, y, table, ids, 0)
