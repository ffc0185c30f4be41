"""Lowerings of the compute-heavy ops: linear / matmul (tiled GEMM), conv2d (direct 3x3 kernel or
im2col + GEMM), the row kernels (rms_norm, layer_norm, softmax, l2_normalize, reductions),
group_norm (partial moments, merge, apply) and sdpa (fused flash kernel, or two GEMMs + softmax
when the head dim is too large for it)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dif.dtypes import DType
from dif.errors import NotImplementedOnBackend
from dif.ir.program import Node
from dif_backend_opencl.lower import BACKEND, LowerCtx, Ref, at, collapse, contiguous_strides, lowers, numel, vec8

TILE = 64  # GEMM output tile (matmul.cl TM / TN)
GEMM_GROUP = 16  # GEMM work-group is GEMM_GROUP x GEMM_GROUP
CONV_TILE = 16
CONV_OCB = 8
FLASH_BQ = 32


def _i32(*values: int) -> tuple[np.int32, ...]:
    return tuple(np.int32(v) for v in values)


def _i64(*values: int) -> tuple[np.int64, ...]:
    return tuple(np.int64(v) for v in values)


def _need_group(ctx: LowerCtx, what: str) -> None:
    """The GEMM and 3x3 conv kernels need 16x16 work-groups (256 work-items)."""
    if ctx.max_group < GEMM_GROUP * GEMM_GROUP:
        raise NotImplementedOnBackend(
            what, BACKEND, f"needs work-groups of {GEMM_GROUP * GEMM_GROUP}; this device allows {ctx.max_group}"
        )


def gemm(
    ctx: LowerCtx,
    c: Ref,
    a: Ref,
    b: Ref,
    *,
    m: int,
    n: int,
    k: int,
    sam: int,
    sak: int,
    sbk: int,
    sbn: int,
    ldc: int,
    batch: Sequence[tuple[int, int, int, int]] = (),
    bias: Ref | None = None,
    bias_mode: int = 0,
    alpha: float = 1.0,
) -> None:
    """C(m, n) = alpha * A(m, k) @ B(k, n) (+ bias per column (mode 1) or per row (mode 2)) for
    strided views; `batch` lists (size, a stride, b stride, c stride), outermost first."""
    import pyopencl.cltypes as ct

    _need_group(ctx, "matmul.cl gemm")
    dims = [d for d in batch if d[0] != 1]
    if len(dims) > 4:  # more batch dims than the kernel decomposes: loop the outermost on the host
        size, sa, sb, sc = dims[0]
        for i in range(size):
            gemm(ctx, c.view(i * sc), a.view(i * sa), b.view(i * sb), m=m, n=n, k=k, sam=sam, sak=sak, sbk=sbk,
                 sbn=sbn, ldc=ldc, batch=dims[1:], bias=bias, bias_mode=bias_mode, alpha=alpha)  # fmt: skip
        return
    dims = [(1, 0, 0, 0)] * (4 - len(dims)) + dims
    nb = math.prod(d[0] for d in dims)
    bshape = ct.make_int4(*(d[0] for d in dims))  # type: ignore[attr-defined]
    strides = [ct.make_long4(*(d[j] for d in dims)) for j in (1, 2, 3)]  # type: ignore[attr-defined]
    gsize = (-(-n // TILE) * GEMM_GROUP, -(-m // TILE) * GEMM_GROUP, nb)
    args = (
        *c.full(), *a.full(), *b.full(), *(bias or c).full(), np.int32(bias_mode if bias is not None else 0),
        *_i32(m, n, k), *_i64(sam, sak, sbk, sbn, ldc), bshape, *strides, np.float32(alpha),
    )  # fmt: skip
    ctx.launch("matmul", "gemm", gsize, (GEMM_GROUP, GEMM_GROUP, 1), *args)


@lowers("linear")
def lower_linear(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    y = outs[0]
    n_out, k = w.type.shape
    m = x.numel // k if k else numel(x.type.shape[:-1])
    gemm(ctx, y, x, w, m=m, n=n_out, k=k, sam=k, sak=1, sbk=1, sbn=k, ldc=n_out, bias=bias, bias_mode=1)


@lowers("matmul")
def lower_matmul(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (a, b), (c,) = ins, outs
    m, k = a.type.shape[-2:]
    n = b.type.shape[-1]
    out_batch = c.type.shape[:-2]
    rank = len(out_batch)

    def batch_strides(r: Ref) -> list[int]:
        shape = r.type.shape[:-2]
        st = contiguous_strides(r.type.shape)[:-2]
        pad = rank - len(shape)
        full, sts = (1,) * pad + tuple(shape), (0,) * pad + tuple(st)
        return [0 if d == 1 and o != 1 else s for d, o, s in zip(full, out_batch, sts, strict=True)]

    c_st = [s for s in contiguous_strides(c.type.shape)[:-2]]
    shape, (sa, sb, sc) = collapse(out_batch, batch_strides(a), batch_strides(b), c_st)
    batch = list(zip(shape, sa, sb, sc, strict=True))
    gemm(ctx, c, a, b, m=m, n=n, k=k, sam=k, sak=1, sbk=n, sbn=1, ldc=n, batch=batch)


@lowers("conv2d")
def lower_conv2d(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    y = outs[0]
    n, c, h, wd = x.type.shape
    o, cg, kh, kw = w.type.shape
    _, _, ho, wo = y.type.shape
    stride, pad, dil, groups = at(node)["stride"], at(node)["padding"], at(node)["dilation"], at(node)["groups"]
    plain = tuple(stride) == (1, 1) and tuple(dil) == (1, 1) and groups == 1
    if plain and (kh, kw) == (3, 3) and ctx.options.conv3x3_direct:
        _need_group(ctx, "conv.cl conv3x3")
        tiles = -(-wo // CONV_TILE) * -(-ho // CONV_TILE)
        gsize = (tiles * CONV_TILE, -(-o // CONV_OCB) * CONV_TILE, n)
        args = (*y.full(), *x.full(), *w.full(), *(bias or y).full(), np.int32(bias is not None),
                *_i32(c, h, wd, o, ho, wo, pad[0], pad[2]))  # fmt: skip
        ctx.launch("conv", "conv3x3", gsize, (CONV_TILE, CONV_TILE, 1), *args)
        return
    og = o // groups
    kk = cg * kh * kw
    p = ho * wo
    if (kh, kw) == (1, 1) and tuple(stride) == (1, 1) and not any(pad):  # the input already is the column matrix
        for g in range(groups):
            gb = bias.view(g * og) if bias is not None else None
            yv, wv, xv = y.view(g * og * p), w.view(g * og * kk), x.view(g * cg * h * wd)
            batch = [(n, 0, c * h * wd, o * p)]
            gemm(ctx, yv, wv, xv, m=og, n=p, k=kk, sam=kk, sak=1, sbk=h * wd, sbn=1, ldc=p, batch=batch, bias=gb,
                 bias_mode=2)  # fmt: skip
        return
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
                ctx.launch_1d("conv", "im2col", cnt, *col.ptr(), *xg.full(), np.int64(cnt), *_i32(*dims))
                yv = y.view((i * o + g * og) * p + p0)
                gemm(ctx, yv, w.view(g * og * kk), col, m=og, n=cur, k=kk, sam=kk, sak=1, sbk=cur, sbn=1, ldc=p,
                     bias=gb, bias_mode=2)  # fmt: skip


@lowers("rms_norm")
def lower_rms_norm(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    x, y = ins[0], outs[0]
    w = ins[1] if len(ins) > 1 else None
    length = x.type.shape[-1]
    a = at(node)
    args = (*y.full(), *x.full(), *(w or x).full(), np.int32(w is not None), np.int32(length),
            np.float32(a["eps"]), np.float32(a["offset"]), np.int32(a["round_before_weight"]))  # fmt: skip
    ctx.launch_rows("norm", "rms_norm", x.numel // max(length, 1), *args)


@lowers("layer_norm")
def lower_layer_norm(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    x, y = ins[0], outs[0]
    w = ins[1] if len(ins) > 1 else None
    b = ins[2] if len(ins) > 2 else None
    length = x.type.shape[-1]
    args = (*y.full(), *x.full(), *(w or x).full(), *(b or x).full(), *_i32(w is not None, b is not None, length),
            np.float32(at(node)["eps"]))  # fmt: skip
    ctx.launch_rows("norm", "layer_norm", x.numel // max(length, 1), *args)


def group_norm(ctx: LowerCtx, y: Ref, x: Ref, w: Ref, b: Ref, groups: int, eps: float, silu: bool = False) -> None:
    """Normalize x[N, C, ...] per (image, channel group); optionally silu the result (fusion hook)."""
    n, c = x.type.shape[:2]
    spatial = numel(x.type.shape[2:])
    rows = n * groups
    length = (c // groups) * spatial
    parts = max(1, min(-(-length // 4096), -(-256 // max(rows, 1))))
    stats = ctx.scratch((rows * parts * 3,))
    ms = ctx.scratch((rows * 2,))
    gsize = (rows * parts * ctx.row_group,)
    ctx.launch(
        "norm", "gn_partial", gsize, (ctx.row_group,), *stats.ptr(), *x.full(), np.int64(length), np.int32(parts)
    )
    ctx.launch_1d("norm", "gn_merge", rows, *ms.ptr(), *stats.ptr(), *_i32(rows, parts), np.float32(eps))
    total = x.numel
    args = (*y.full(), *x.full(), *ms.ptr(), *w.full(), *b.full(), *_i64(total, length), *_i32(spatial, c, silu))
    ctx.launch_1d("norm", "gn_apply", total, *args)


@lowers("group_norm")
def lower_group_norm(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x, w, b), (y,) = ins, outs
    group_norm(ctx, y, x, w, b, int(at(node)["groups"]), float(at(node)["eps"]))


def _axis_rows(x: Ref, axis: int) -> tuple[int, int, int]:
    shape = x.type.shape
    a = axis % max(len(shape), 1)
    outer, length, inner = numel(shape[:a]), shape[a] if shape else 1, numel(shape[a + 1 :])
    return outer, length, inner


@lowers("softmax")
def lower_softmax(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    outer, length, inner = _axis_rows(x, at(node)["axis"])
    ctx.launch_rows("norm", "softmax_axis", outer * inner, *y.full(), *x.full(), *_i32(length, inner))


@lowers("l2_normalize")
def lower_l2(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    outer, length, inner = _axis_rows(x, at(node)["axis"])
    args = (*y.full(), *x.full(), *_i32(length, inner), np.float32(at(node)["eps"]))
    ctx.launch_rows("norm", "l2norm_axis", outer * inner, *args)


@lowers("reduce_sum", "reduce_mean", "reduce_max")
def lower_reduce(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    (x,), (y,) = ins, outs
    shape = x.type.shape
    axes = {a % len(shape) for a in at(node)["axes"]}
    st = contiguous_strides(shape)
    kshape, (kst,) = collapse(
        [d for i, d in enumerate(shape) if i not in axes], [s for i, s in enumerate(st) if i not in axes]
    )
    rshape, (rst,) = collapse([d for i, d in enumerate(shape) if i in axes], [s for i, s in enumerate(st) if i in axes])
    mode = {"reduce_sum": 0, "reduce_mean": 1, "reduce_max": 2}[node.op]
    count = numel(rshape)
    args = (*y.full(), *x.full(), vec8(kshape, 1), vec8(kst, 0), vec8(rshape, 1), vec8(rst, 0),
            np.int64(count), np.int32(mode))  # fmt: skip
    ctx.launch_rows("norm", "reduce", y.numel, *args)


@lowers("sdpa")
def lower_sdpa(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> None:
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) > 3 else None
    (o,) = outs
    bsz, sq, hq, d = q.type.shape
    _, skv, hkv, dv = v.type.shape
    scale = float(np.float32(at(node)["scale"] or 1.0 / math.sqrt(d)))
    causal = bool(at(node)["causal"])
    limit = ctx.options.fused_attention_max_dim
    if d <= limit and dv <= limit:
        gsize = (-(-sq // FLASH_BQ) * FLASH_BQ, bsz * hq)
        args = (*o.full(), *q.full(), *k.full(), *v.full(), *(mask or q).full(), np.int32(mask is not None),
                *_i32(sq, skv, hq, hkv), np.float32(scale), np.int32(causal))  # fmt: skip
        ctx.launch("attention", "flash_attention", gsize, (FLASH_BQ, 1), *args, defines={"HD": d, "HDV": dv})
        return
    _sdpa_unfused(ctx, o, q, k, v, mask, scale, causal)


def _sdpa_unfused(ctx: LowerCtx, o: Ref, q: Ref, k: Ref, v: Ref, mask: Ref | None, scale: float, causal: bool) -> None:
    """scores = q k^T (GEMM), masked softmax in place, o = p v (GEMM); per batch element and block
    of kv heads so the fp32 scores stay under the scratch cap. Heads are split (kv head, repeat)
    so GQA is two batch dims of the GEMMs rather than a copy."""
    bsz, sq, hq, d = q.type.shape
    _, skv, hkv, dv = v.type.shape
    rep = hq // hkv
    per_kv = rep * sq * skv * 4
    chunk = max(1, min(hkv, ctx.options.scratch_cap_bytes // max(per_kv, 1)))
    for b in range(bsz):
        for h0 in range(0, hkv, chunk):
            kvc = min(chunk, hkv - h0)
            s = ctx.scratch((kvc, rep, sq, skv), DType.F32)
            qv = q.view((b * sq * hq + h0 * rep) * d)
            kv_ = k.view((b * skv * hkv + h0) * d)
            gemm(ctx, s, qv, kv_, m=sq, n=skv, k=d, sam=hq * d, sak=1, sbk=1, sbn=hkv * d, ldc=skv,
                 batch=[(kvc, rep * d, d, rep * sq * skv), (rep, d, 0, sq * skv)])  # fmt: skip
            mref = mask.view(b * skv) if mask is not None else q
            args = (*s.ptr(), *_i32(sq, skv), np.float32(scale), *mref.full(), *_i32(mask is not None, causal))
            ctx.launch_rows("norm", "attn_softmax", kvc * rep * sq, *args)
            ov = o.view((b * sq * hq + h0 * rep) * dv)
            vv = v.view((b * skv * hkv + h0) * dv)
            gemm(ctx, ov, s, vv, m=sq, n=dv, k=skv, sam=skv, sak=1, sbk=hkv * dv, sbn=1, ldc=hq * dv,
                 batch=[(kvc, rep * sq * skv, dv, rep * dv), (rep, sq * skv, 0, dv)])  # fmt: skip
