"""Lowerings of layout ops (reshape, transpose, slice, split, concat, broadcast_to, pad, take,
embedding, upsample_nearest) onto the element-size-typed kernels of `kernels/layout.cl`.

Everything is one strided copy (`copy{1,2,4,8}`) from a view of the source to a view of the
result, except pad and take; a copy that is contiguous on both sides is a plain buffer copy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.ir.program import Node
from dif_backend_opencl.lower import (
    LowerCtx,
    Ref,
    at,
    broadcast_strides,
    collapse,
    contiguous_strides,
    lowers,
    numel,
    vec8,
)
from dif_backend_opencl.lower_elementwise import fill_bits

LAYOUT = "layout"


def strided_copy(
    ctx: LowerCtx, dst: Ref, dst_strides: Sequence[int], src: Ref, src_strides: Sequence[int], shape: Sequence[int]
) -> None:
    """dst[view] = src[view], both views of `shape` with the given element strides."""
    n = numel(shape)
    if n == 0:
        return
    cshape, (ds, ss) = collapse(shape, dst_strides, src_strides)
    contig = contiguous_strides(cshape)
    flat = (1 if ds == contig else 0) | (2 if ss == contig else 0)
    if flat == 3:
        ctx.copy(dst.view(0, (n,)), src.view(0, (n,)))
        return
    size = dst.dtype.itemsize
    args = (*dst.ptr(), *src.ptr(), np.int64(n), vec8(cshape, 1), vec8(ds, 0), vec8(ss, 0), np.int32(flat))
    ctx.launch_1d(LAYOUT, f"copy{size}", n, *args)


def _axis(node: Node, rank: int) -> int:
    return int(at(node)["axis"]) % max(rank, 1)


@lowers("reshape")
def lower_reshape(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    ctx.copy(outs[0], ins[0])  # an unaliased result has its own slot (aliased reshapes are never lowered)


@lowers("transpose")
def lower_transpose(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    xs = contiguous_strides(x.type.shape)
    perm = at(node)["perm"]
    strided_copy(ctx, y, contiguous_strides(y.type.shape), x, [xs[p] for p in perm], y.type.shape)


@lowers("broadcast_to")
def lower_broadcast(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    shape = y.type.shape
    strided_copy(ctx, y, contiguous_strides(shape), x, broadcast_strides(x.type.shape, shape), shape)


@lowers("slice")
def lower_slice(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    a = _axis(node, x.type.rank)
    start, _, step = slice(at(node)["start"], at(node)["stop"], at(node)["step"]).indices(x.type.shape[a])
    xs = list(contiguous_strides(x.type.shape))
    src = x.view(start * xs[a])
    xs[a] *= step
    strided_copy(ctx, y, contiguous_strides(y.type.shape), src, xs, y.type.shape)


@lowers("split")
def lower_split(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,) = ins
    a = _axis(node, x.type.rank)
    xs = contiguous_strides(x.type.shape)
    start = 0
    for y in outs:
        strided_copy(ctx, y, contiguous_strides(y.type.shape), x.view(start * xs[a]), xs, y.type.shape)
        start += y.type.shape[a]


@lowers("concat")
def lower_concat(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (y,) = outs
    a = _axis(node, y.type.rank)
    ys = contiguous_strides(y.type.shape)
    start = 0
    for x in ins:
        strided_copy(ctx, y.view(start * ys[a]), ys, x, contiguous_strides(x.type.shape), x.type.shape)
        start += x.type.shape[a]


@lowers("upsample_nearest")
def lower_upsample(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    n, c, h, w = x.type.shape
    s = int(at(node)["scale"])
    shape = (n, c, h, s, w, s)  # y viewed so that each source pixel is read with zero strides
    src = (c * h * w, h * w, w, 0, 1, 0)
    strided_copy(ctx, y, contiguous_strides(shape), x, src, shape)


@lowers("pad")
def lower_pad(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    pads = at(node)["pads"]
    n = y.numel
    size, bits = fill_bits(at(node)["value"], x.dtype)
    mode = np.int32(at(node)["mode"] == "reflect")
    before = [pads[2 * i] for i in range(x.type.rank)]
    args = (*y.ptr(), *x.ptr(), np.int64(n), vec8(y.type.shape, 1), vec8(x.type.shape, 1), vec8(before, 0), mode, bits)
    ctx.launch_1d(LAYOUT, f"pad{size}", n, *args)


def _take(ctx: LowerCtx, y: Ref, x: Ref, idx: Ref, axis: int) -> None:
    shape = x.type.shape
    inner = numel(shape[axis + 1 :])
    n = y.numel
    size = x.dtype.itemsize
    dims = (np.int32(shape[axis]), np.int32(idx.numel), np.int32(inner))
    ctx.launch_1d(LAYOUT, f"take{size}", n, *y.ptr(), *x.ptr(), *idx.full(), np.int64(n), *dims)


@lowers("take")
def lower_take(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x, idx), (y,) = ins, outs
    _take(ctx, y, x, idx, _axis(node, x.type.rank))


@lowers("embedding")
def lower_embedding(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (ids, table), (y,) = ins, outs
    _take(ctx, y, table, ids, 0)
