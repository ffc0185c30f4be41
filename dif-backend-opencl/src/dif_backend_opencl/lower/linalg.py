"""OpenCL lowerings of `dif.ops.linalg` (linear, matmul) onto the tiled GEMM of `kernels/linalg.cl`;
`gemm` also serves conv2d (im2col / 1x1) and the unfused attention, and `linear` with the GEMM's epilogues
the fused linear_add (`lower/fused.py`) and the quantized linears (`lower/quant.py`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dif.errors import NotImplementedOnBackend
from dif.ir.program import Node
from dif_backend_opencl.lower.base import (
    BACKEND,
    Attrs,
    LowerCtx,
    Ref,
    Refs,
    Steps,
    collapse,
    contiguous_strides,
    i32s,
    i64s,
    lowers,
    numel,
)

Int4Weight = tuple[Ref, Ref, int]
"""int4_linear's weight for the GEMM's B operand: (packed nibbles u8[out, in/2], group scales f16[out, in/group],
the group size)."""

TILE = 64  # GEMM output tile (linalg.cl TM / TN)
GEMM_GROUP = 16  # GEMM work-group is GEMM_GROUP x GEMM_GROUP


def need_group(ctx: LowerCtx, what: str) -> None:
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
    scales: tuple[Ref, Ref] | None = None,
    residual: Ref | None = None,
    int4: Int4Weight | None = None,
) -> Steps:
    """C(m, n) = alpha * A(m, k) @ B(k, n) (* rows[m] * cols[n] with `scales` = (rows, cols), fp32)
    (+ bias per column (mode 1) or per row (mode 2)) (rounded to C's dtype + `residual`, laid out like C)
    for strided views; `batch` lists (size, a stride, b stride, c stride), outermost first. With `int4`,
    B(k, n) is unpacked from int4_linear's weight [n, k] in the tile loads (`b` and its strides unused)."""
    import pyopencl.cltypes as ct

    need_group(ctx, "linalg.cl gemm")
    dims = [d for d in batch if d[0] != 1]
    if len(dims) > 4:  # more batch dims than the kernel decomposes: loop the outermost on the host
        size, sa, sb, sc = dims[0]
        steps: Steps = []
        for i in range(size):
            steps += gemm(ctx, c.view(i * sc), a.view(i * sa), b.view(i * sb), m=m, n=n, k=k, sam=sam, sak=sak,
                          sbk=sbk, sbn=sbn, ldc=ldc, batch=dims[1:], bias=bias, bias_mode=bias_mode,
                          alpha=alpha, scales=scales, int4=int4,
                          residual=None if residual is None else residual.view(i * sc))  # fmt: skip
        return steps
    dims = [(1, 0, 0, 0)] * (4 - len(dims)) + dims
    nb = math.prod(d[0] for d in dims)
    bshape = ct.make_int4(*(d[0] for d in dims))  # type: ignore[attr-defined]
    strides = [ct.make_long4(*(d[j] for d in dims)) for j in (1, 2, 3)]  # type: ignore[attr-defined]
    gsize = (-(-n // TILE) * GEMM_GROUP, -(-m // TILE) * GEMM_GROUP, nb)
    rows, cols = scales or (c, c)  # unused operands point at C
    packed, groups, group = int4 or (c, c, 0)
    args = (
        *c.full(), *a.full(), *b.full(), *(bias or c).full(), np.int32(bias_mode if bias is not None else 0),
        *rows.ptr(), *cols.ptr(), np.int32(scales is not None), *(residual or c).full(), np.int32(residual is not None),
        *i32s(m, n, k), *i64s(sam, sak, sbk, sbn, ldc), bshape, *strides, np.float32(alpha),
        *packed.ptr(), *groups.full(), np.int32(group),
    )  # fmt: skip
    return ctx.launch("linalg", "gemm", gsize, (GEMM_GROUP, GEMM_GROUP, 1), *args)


def linear(
    ctx: LowerCtx,
    y: Ref,
    x: Ref,
    w: Ref,
    bias: Ref | None = None,
    *,
    scales: tuple[Ref, Ref] | None = None,
    residual: Ref | None = None,
    int4: Int4Weight | None = None,
) -> Steps:
    """y[..., out] = x[..., in] @ w[out, in]^T (+ bias[out]) with `gemm`'s epilogues: `scales` = (per row of x
    [..., 1], per output [out]), `residual` [..., out]; with `int4`, w is its packed weight [out, in/2]."""
    n_out = w.type.shape[0]
    k = x.type.shape[-1]
    m = x.numel // k if k else numel(x.type.shape[:-1])
    return gemm(ctx, y, x, w, m=m, n=n_out, k=k, sam=k, sak=1, sbk=1, sbn=k, ldc=n_out, bias=bias, bias_mode=1,
                scales=scales, residual=residual, int4=int4)  # fmt: skip


@lowers("linear")
def lower_linear(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    return linear(ctx, outs[0], ins[0], ins[1], ins[2] if len(ins) > 2 else None)


@lowers("matmul")
def lower_matmul(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
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
    shape, (sa, sb, sc) = collapse(out_batch, [batch_strides(a), batch_strides(b), c_st])
    batch = list(zip(shape, sa, sb, sc, strict=True))
    return gemm(ctx, c, a, b, m=m, n=n, k=k, sam=k, sak=1, sbk=n, sbn=1, ldc=n, batch=batch)
