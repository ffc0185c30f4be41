"""OpenCL lowerings of `dif.ops.conv`: conv2d (the direct 3x3 kernel of `kernels/conv.cl`, a 1x1 conv as
one GEMM, else im2col + GEMM in scratch-capped chunks) and upsample_nearest (a strided copy)."""

from __future__ import annotations

import numpy as np

from dif.ir.program import Node
from dif_backend_opencl.lower.base import Attrs, LowerCtx, Refs, Steps, contiguous_strides, i32s, lowers
from dif_backend_opencl.lower.layout import strided_copy
from dif_backend_opencl.lower.linalg import gemm, need_group

CONV_TILE = 16
CONV_OCB = 8


@lowers("conv2d")
def lower_conv2d(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    y = outs[0]
    n, c, h, wd = x.type.shape
    o, cg, kh, kw = w.type.shape
    _, _, ho, wo = y.type.shape
    stride, pad, dil, groups = attrs["stride"], attrs["padding"], attrs["dilation"], attrs["groups"]
    plain = tuple(stride) == (1, 1) and tuple(dil) == (1, 1) and groups == 1
    if plain and (kh, kw) == (3, 3) and ctx.options.conv3x3_direct:
        need_group(ctx, "conv.cl conv3x3")
        tiles = -(-wo // CONV_TILE) * -(-ho // CONV_TILE)
        gsize = (tiles * CONV_TILE, -(-o // CONV_OCB) * CONV_TILE, n)
        args = (*y.full(), *x.full(), *w.full(), *(bias or y).full(), np.int32(bias is not None),
                *i32s(c, h, wd, o, ho, wo, pad[0], pad[2]))  # fmt: skip
        return ctx.launch("conv", "conv3x3", gsize, (CONV_TILE, CONV_TILE, 1), *args)
    og = o // groups
    kk = cg * kh * kw
    p = ho * wo
    steps: Steps = []
    if (kh, kw) == (1, 1) and tuple(stride) == (1, 1) and not any(pad):  # the input already is the column matrix
        for g in range(groups):
            gb = bias.view(g * og) if bias is not None else None
            yv, wv, xv = y.view(g * og * p), w.view(g * og * kk), x.view(g * cg * h * wd)
            batch = [(n, 0, c * h * wd, o * p)]
            steps += gemm(ctx, yv, wv, xv, m=og, n=p, k=kk, sam=kk, sak=1, sbk=h * wd, sbn=1, ldc=p, batch=batch,
                          bias=gb, bias_mode=2)  # fmt: skip
        return steps
    pc = max(1, min(p, ctx.options.scratch_cap_bytes // max(4 * kk, 1)))
    for i in range(n):
        for g in range(groups):
            xg = x.view((i * c + g * cg) * h * wd)
            gb = bias.view(g * og) if bias is not None else None
            for p0 in range(0, p, pc):
                cur = min(pc, p - p0)
                col = ctx.scratch((kk, cur))
                cnt = kk * cur
                dims = (h, wd, kh, kw, stride[0], stride[1], pad[0], pad[2], dil[0], dil[1], wo, p0, cur)
                steps += ctx.launch_1d("conv", "im2col", cnt, *col.ptr(), *xg.full(), np.int64(cnt), *i32s(*dims))
                yv = y.view((i * o + g * og) * p + p0)
                steps += gemm(ctx, yv, w.view(g * og * kk), col, m=og, n=cur, k=kk, sam=kk, sak=1, sbk=cur, sbn=1,
                              ldc=p, bias=gb, bias_mode=2)  # fmt: skip
    return steps


@lowers("upsample_nearest")
def lower_upsample(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    n, c, h, w = x.type.shape
    s = int(attrs["scale"])
    shape = (n, c, h, s, w, s)  # y viewed so that each source pixel is read with zero strides
    src = (c * h * w, h * w, w, 0, 1, 0)
    return strided_copy(ctx, y, contiguous_strides(shape), x, src, shape)
