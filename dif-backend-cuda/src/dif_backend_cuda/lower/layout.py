"""CUDA lowerings of `dif.ops.layout` (reshape, transpose, broadcast_to, concat, split, slice, pad, take,
embedding) to device copies and the dtype-agnostic kernels of `kernels/layout.cu` (elements moved as
1/2/4/8/16-byte words; `widen` picks the widest word the layout allows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dif.ir.program import Node
from dif_backend_cuda.lower.base import (
    INTS,
    Attrs,
    Copy,
    DevTensor,
    LowerCtx,
    Steps,
    Ts,
    bits,
    broadcast_strides,
    collapse,
    contiguous_strides,
    fill_steps,
    i64,
    lowering,
    need,
    ptr,
    strided_meta,
    unsupported,
)


def widen(
    shape: Sequence[int], src_strides: Sequence[int], dst_strides: Sequence[int], width: int, src: int, dst: int
) -> tuple[list[int], list[int], list[int], int]:
    """Move pairs of elements as one word of twice the width (up to 128 bits) while the innermost run is
    contiguous on both sides, even in length, and every address stays aligned to the wider word."""
    shp, (ss, ds) = collapse(shape, [src_strides, dst_strides])
    while (
        width < 128
        and ss[-1] == 1
        and ds[-1] == 1
        and shp[-1] % 2 == 0
        and all(v % 2 == 0 for v in ss[:-1] + ds[:-1])
        and src % (width // 4) == 0
        and dst % (width // 4) == 0
    ):
        shp[-1] //= 2
        ss = [v // 2 for v in ss[:-1]] + [1]
        ds = [v // 2 for v in ds[:-1]] + [1]
        width *= 2
    return shp, ss, ds, width


TILE = 32  # kernels/layout.cu transpose_tile: a TILE x TILE tile per block of TILE x TILE_ROWS threads
TILE_ROWS = 8
GRID_YZ = 65535  # CUDA's limit on grid dimensions y and z


def transpose_tile(
    ctx: LowerCtx,
    src: int,
    dst: int,
    shape: Sequence[int],
    src_strides: Sequence[int],
    dst_strides: Sequence[int],
    width: int,
) -> Any | None:
    """The tiled-transpose launch of a copy that is a (batched) 2-D transpose, else None. In the copy's
    collapsed form the destination's innermost axis is contiguous while the source's contiguous axis is the
    next one out: [batch,] cols, rows with source strides [batch,] 1, row and destination [batch,] row, 1."""
    shp, (ss, ds) = collapse(shape, [src_strides, dst_strides])
    if width > 64 or len(shp) not in (2, 3) or ds[-1] != 1 or ss[-2] != 1 or ss[-1] == 1:
        return None
    batch, src_batch, dst_batch = (shp[0], ss[0], ds[0]) if len(shp) == 3 else (1, 0, 0)
    cols, rows = shp[-2], shp[-1]
    grid = (-(-cols // TILE), -(-rows // TILE), batch)
    if grid[1] > GRID_YZ or grid[2] > GRID_YZ:
        return None
    args = [np.uint64(src), np.uint64(dst), *map(i64, (rows, cols, ss[-1], ds[-2], src_batch, dst_batch))]
    return ctx.kernel("layout", f"transpose_tile_u{width}", grid, (TILE, TILE_ROWS), args)


def copy_steps(
    ctx: LowerCtx,
    src: int,
    dst: int,
    shape: Sequence[int],
    src_strides: Sequence[int],
    dst_strides: Sequence[int],
    width: int,
) -> list[Any]:
    """Copy `shape` elements of `width` bits between two strided views (element strides)."""
    if math.prod(shape) == 0:
        return []
    if (tiled := transpose_tile(ctx, src, dst, shape, src_strides, dst_strides, width)) is not None:
        return [tiled]
    shape, src_strides, dst_strides, width = widen(shape, src_strides, dst_strides, width, src, dst)
    n = math.prod(shape)
    meta = ctx.meta(strided_meta(shape, [src_strides, dst_strides]))
    return [ctx.flat("layout", f"strided_copy_u{width}", n, [np.uint64(src), np.uint64(dst), meta, i64(n)])]


def _contiguous(node: Node, *tensors: DevTensor) -> None:
    if any(t.pitched for t in tensors):
        raise unsupported(node, "a pitched view that is not in place would need a strided copy")


@lowering("reshape")
def _reshape(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    if outs[0].ptr == ins[0].ptr:  # the plan aliased the result onto its operand's bytes
        return []
    _contiguous(node, ins[0], outs[0])
    return [Copy(outs[0].ptr, ins[0].ptr, outs[0].nbytes)]


@lowering("transpose")
def _transpose(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    xs = contiguous_strides(x.shape)
    src = [xs[p] for p in attrs["perm"]]
    return copy_steps(ctx, x.ptr, y.ptr, y.shape, src, contiguous_strides(y.shape), bits(y))


@lowering("broadcast_to")
def _broadcast_to(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    return copy_steps(
        ctx, x.ptr, y.ptr, y.shape, broadcast_strides(x.shape, y.shape), contiguous_strides(y.shape), bits(y)
    )


def _part_copies(ctx: LowerCtx, node: Node, whole: DevTensor, parts: Ts, axis: int, into_whole: bool) -> Steps:
    """Copies between `whole` and its consecutive `parts` along `axis` (concat: parts into the whole;
    split: the whole into parts), skipping every part already in place: a view the plan made, written
    there by its producer (concat) or read there by its users (split)."""
    ws = contiguous_strides(whole.shape)
    steps: list[Any] = []
    start = 0
    for t in parts:
        at = whole.at(start * ws[axis])
        if t.ptr != at:
            _contiguous(node, t, whole)
            ts = contiguous_strides(t.shape)
            if into_whole:
                steps += copy_steps(ctx, t.ptr, at, t.shape, ts, ws, bits(t))
            else:
                steps += copy_steps(ctx, at, t.ptr, t.shape, ws, ts, bits(t))
        start += t.shape[axis]
    return steps


@lowering("concat")
def _concat(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (y,) = outs
    return _part_copies(ctx, node, y, ins, attrs["axis"] % len(y.shape), into_whole=True)


@lowering("split")
def _split(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,) = ins
    return _part_copies(ctx, node, x, outs, attrs["axis"] % len(x.shape), into_whole=False)


@lowering("slice")
def _slice(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    axis = attrs["axis"] % len(x.shape)
    first = range(*slice(attrs["start"], attrs["stop"], attrs["step"]).indices(x.shape[axis])).start
    xs = contiguous_strides(x.shape)
    src = list(xs)
    src[axis] = xs[axis] * attrs["step"]
    return copy_steps(ctx, x.at(first * xs[axis]), y.ptr, y.shape, src, contiguous_strides(y.shape), bits(y))


@lowering("pad")
def _pad(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    pads = attrs["pads"]
    before = [pads[2 * i] for i in range(len(x.shape))]
    ys = contiguous_strides(y.shape)
    if attrs["mode"] == "reflect":
        r = len(x.shape)
        meta = ctx.meta([r, *y.shape, *x.shape, *before, *contiguous_strides(x.shape)])
        return [ctx.flat("layout", f"pad_reflect_u{bits(y)}", y.numel, [ptr(x), ptr(y), meta, i64(y.numel)])]
    steps = fill_steps(ctx, y, np.asarray(attrs["value"]))
    offset = sum(b * s for b, s in zip(before, ys, strict=True))
    return steps + copy_steps(ctx, x.ptr, y.at(offset), x.shape, contiguous_strides(x.shape), ys, bits(y))


def _take_steps(ctx: LowerCtx, node: Node, x: DevTensor, idx: DevTensor, y: DevTensor, axis: int) -> list[Any]:
    it = need(node, idx.dtype, INTS)
    inner = math.prod(x.shape[axis + 1 :])  # outer extent is implied: numel / (n_idx * inner)
    args = [ptr(x), ptr(idx), ptr(y), i64(y.numel), i64(idx.numel), i64(x.shape[axis]), i64(inner)]
    return [ctx.flat("layout", f"take_u{bits(y)}_{it}", y.numel, args)]


@lowering("take")
def _take(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, idx), (y,) = ins, outs
    return _take_steps(ctx, node, x, idx, y, attrs["axis"] % len(x.shape))


@lowering("embedding")
def _embedding(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (ids, table), (y,) = ins, outs
    return _take_steps(ctx, node, table, ids, y, 0)
