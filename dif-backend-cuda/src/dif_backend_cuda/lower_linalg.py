"""Lowering of matrix products, convolution and attention: cuBLASLt / cuDNN when the backend has them
and the problem fits, else the NVRTC kernels of `kernels/gemm.cu` and `kernels/attention.cu`. The path
taken per node is recorded in `LowerCtx.choices` (shown by the executable and the smoke script).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from attrs import evolve

from dif.ir.program import Node
from dif_backend_cuda.lower import (
    FLOATS,
    THREADS,
    Attrs,
    DevTensor,
    LowerCtx,
    Steps,
    Ts,
    broadcast_strides,
    collapse,
    contiguous_strides,
    f32,
    i64,
    lowering,
    need,
    ptr,
    row_stride,
    row_threads,
    strided_meta,
    unsupported,
)

TILE = 64
MAX_GRID_Z = 65535


def _lt_step(ctx: LowerCtx, node: Node, problem: Any) -> Any | None:
    """A cuBLASLt step for `problem`, or None (reason recorded) when the NVRTC GEMM must run."""
    if ctx.backend.options["gemm"] == "nvrtc":
        return None
    lt = ctx.backend.lt()
    if lt is None:
        if ctx.backend.options["gemm"] == "cublaslt":
            raise unsupported(node, f"cuBLASLt requested but unavailable: {ctx.backend._lt_error}")
        return None
    from dif_backend_cuda.gemm import LtMatmul

    try:
        step = LtMatmul(lt, problem)
    except Exception as exc:
        if ctx.backend.options["gemm"] == "cublaslt":
            raise unsupported(node, f"cuBLASLt rejected the problem: {exc}") from exc
        ctx.choices[node.id] = f"nvrtc-gemm (cuBLASLt: {type(exc).__name__}: {exc})"
        return None
    tuned = step.tune(ctx.backend.stream) if ctx.backend.options["gemm_tune"] else "heuristic's first"
    ctx.choices[node.id] = f"cublaslt ({tuned})"
    return step


def _gemm_kernel(
    ctx: LowerCtx,
    node: Node,
    dt: str,
    a: int,
    b: int,
    bias: int,
    c: int,
    batch_meta: list[int],
    batch: int,
    m: int,
    n: int,
    k: int,
    strides: tuple[int, int, int, int, int],
) -> Any:
    ctx.choices.setdefault(node.id, "nvrtc-gemm")
    grid = (-(-n // TILE), -(-m // TILE), max(1, min(batch, MAX_GRID_Z)))
    args = [
        np.uint64(a),
        np.uint64(b),
        np.uint64(bias),
        np.uint64(c),
        ctx.meta(batch_meta),
        i64(batch),
        i64(m),
        i64(n),
        i64(k),
        *(i64(s) for s in strides),
    ]
    return ctx.kernel("gemm", f"gemm_{dt}", grid, (256,), args)


@lowering("linear")
def _linear(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    (y,) = outs
    dt = need(node, x.dtype, FLOATS)
    k, out = x.shape[-1], w.shape[0]
    rows = x.numel // k if k else 0
    if k == 0:
        raise unsupported(node, "zero-length contraction")
    from dif_backend_cuda.gemm import linear_problem

    lds = (row_stride(node, x, 1), row_stride(node, w, 1), row_stride(node, y, 1))
    problem = linear_problem(x.dtype, x.ptr, w.ptr, y.ptr, bias.ptr if bias else 0, rows, k, out, lds)
    step = _lt_step(ctx, node, problem)
    if step is not None:
        return [step]
    ldx, ldw, ldy = lds
    return [
        _gemm_kernel(
            ctx, node, dt, x.ptr, w.ptr, ptr(bias).item(), y.ptr, [1, 1, 0, 0], 1, rows, out, k, (ldx, 1, 1, ldw, ldy)
        )
    ]


@lowering("matmul")
def _matmul(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (a, b), (c,) = ins, outs
    dt = need(node, a.dtype, FLOATS)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if k == 0:
        raise unsupported(node, "zero-length contraction")
    batch_shape = c.shape[:-2]
    batch = math.prod(batch_shape)
    a_st = [s * m * k for s in broadcast_strides(a.shape[:-2], batch_shape)]
    b_st = [s * k * n for s in broadcast_strides(b.shape[:-2], batch_shape)]
    cshape, (ca, cb) = collapse(batch_shape, [a_st, b_st])
    if len(cshape) == 1:
        from dif_backend_cuda.gemm import matmul_problem

        step = _lt_step(ctx, node, matmul_problem(a.dtype, a.ptr, b.ptr, c.ptr, m, k, n, batch, ca[0], cb[0]))
        if step is not None:
            return [step]
    meta = [len(cshape), *cshape, *ca, *cb]
    return [_gemm_kernel(ctx, node, dt, a.ptr, b.ptr, 0, c.ptr, meta, batch, m, n, k, (k, 1, n, 1, n))]


@lowering("conv2d")
def _conv2d(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    (y,) = outs
    dt = need(node, x.dtype, FLOATS)
    n, c, h, wd = x.shape
    o, _cg, kh, kw = w.shape
    ho, wo = y.shape[2], y.shape[3]
    groups = attrs["groups"]
    (sh, sw), (pt, _pb, pl, _pr), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
    if groups > MAX_GRID_Z:
        raise unsupported(node, f"{groups} groups")
    step = _cudnn_conv_step(ctx, node, x, w, y, attrs)
    if step is not None:
        if bias is None:
            return [step]
        # y += bias[channel]: the broadcast add kernel, in place (each element read, then written, once)
        b4 = DevTensor(bias.ptr, (1, o, 1, 1), bias.dtype)
        meta = ctx.meta(strided_meta(y.shape, [contiguous_strides(y.shape), broadcast_strides(b4.shape, y.shape)]))
        add = ctx.flat("elementwise", f"binary_add_{dt}", y.numel, [ptr(y), ptr(b4), ptr(y), meta, i64(y.numel)])
        return [step, add]
    ctx.choices.setdefault(node.id, "nvrtc-implicit-gemm")
    grid = (-(-(n * ho * wo) // TILE), -(-(o // groups) // TILE), groups)
    geometry = (n, c, h, wd, o, kh, kw, ho, wo, sh, sw, pt, pl, dh, dw, groups)
    args = [ptr(x), ptr(w), ptr(bias), ptr(y), *(i64(v) for v in geometry)]
    return [ctx.kernel("gemm", f"conv2d_{dt}", grid, (256,), args)]


def _cudnn_conv_step(ctx: LowerCtx, node: Node, x: DevTensor, w: DevTensor, y: DevTensor, attrs: Attrs) -> Any:
    """A cuDNN convolution step, or None (reason recorded) when the NVRTC implicit GEMM must run."""
    if ctx.backend.options["gemm"] == "nvrtc":  # the portable kernels were asked for
        return None
    from dif_backend_cuda.conv import CudnnConv, eligible

    reason = eligible(x.dtype, attrs["groups"], attrs["padding"])
    handle = ctx.backend.cudnn() if not reason else None
    if handle is None and not reason:
        reason = f"cuDNN unavailable: {ctx.backend._cudnn_error}"
    if not reason:
        pt, _pb, pl, _pr = attrs["padding"]
        try:
            step = CudnnConv(
                handle, x.dtype, x.shape, w.shape, y.shape, x.ptr, w.ptr, y.ptr, (pt, pl), attrs["stride"],
                attrs["dilation"],
            )  # fmt: skip
        except Exception as exc:
            reason = f"cuDNN rejected it: {type(exc).__name__}: {str(exc)[:200]}"
        else:
            ctx.choices[node.id] = f"cudnn-conv ({step.choice})"
            return step
    ctx.choices[node.id] = f"nvrtc-implicit-gemm ({reason})"
    return None


FA_WARPS, FA_TILE, FA_MAX_DV, FA_WIDE_DV = 4, 32, 256, 512


@lowering("sdpa")
def _sdpa(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    q, k, v = ins[0], ins[1], ins[2]
    mask = ins[3] if len(ins) > 3 else None
    (o,) = outs
    dt = need(node, q.dtype, FLOATS)
    b, sq, hq, d = q.shape
    skv, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    scale = attrs["scale"] or 1.0 / math.sqrt(d)
    causal = bool(attrs["causal"])
    strides = [row_stride(node, t, 2) for t in (q, k, v, o)]
    cudnn_steps = _cudnn_steps(ctx, node, q, k, v, mask, o, scale, causal, strides)
    if cudnn_steps is not None:
        return cudnn_steps
    if dv > FA_MAX_DV and mask is None and not causal:
        steps = _sdpa_by_gemms(ctx, node, q, k, v, o, scale, strides)
        if steps is not None:
            return steps
    if dv > FA_WIDE_DV:
        raise unsupported(node, f"value head dim {dv} > {FA_WIDE_DV} in the flash kernel")
    shared = 4 * (FA_TILE * (d + 1) + FA_TILE * dv + FA_WARPS * d)
    launch = ctx.kernel(
        "attention",
        f"flash_attn_{'wide_' if dv > FA_MAX_DV else ''}{dt}",
        (-(-sq // FA_WARPS), hq, b),
        (FA_WARPS * 32,),
        [
            ptr(q),
            ptr(k),
            ptr(v),
            ptr(mask),
            ptr(o),
            i64(sq),
            i64(skv),
            i64(hq),
            i64(hkv),
            np.int32(d),
            np.int32(dv),
            f32(scale),
            np.int32(causal),
            *(i64(st) for st in strides),
        ],
        shared,
    )
    if shared > 48 * 1024:
        limit = int(ctx.backend.props["smem_optin"])
        if shared > limit:
            raise unsupported(node, f"head dims {d}/{dv} need {shared} B of shared memory (device: {limit})")
        launch.fn.max_dynamic_shared_size_bytes = shared
    return [launch]


def _sdpa_by_gemms(
    ctx: LowerCtx, node: Node, q: DevTensor, k: DevTensor, v: DevTensor, o: DevTensor, scale: float, strides: list[int]
) -> Steps | None:
    """Wide heads (a VAE's single 512-channel head) as three library-speed steps per (batch, head):
    S = scale * Q K^T (cuBLASLt, into a scratch [Sq, Skv] of q's dtype), softmax(S) in place, O = S V
    (cuBLASLt). The scores are stored in q's dtype before the softmax (as an unfused bf16 attention
    does); None when cuBLASLt is not in use."""
    import cupy

    from dif_backend_cuda.gemm import OP_N, GemmProblem, LtMatmul, linear_problem

    lt = ctx.backend.lt() if ctx.backend.options["gemm"] != "nvrtc" else None
    if lt is None:
        return None
    b, sq, hq, d = q.shape
    skv, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    qt, kt, vt, ot = strides
    size = q.dtype.itemsize
    # the scores live outside the plan's arena, owned by the first step (so as long as the graph)
    scratch = cupy.cuda.Memory(sq * skv * size)
    s_ptr = scratch.ptr
    steps: Steps = []
    dt = q.dtype.value
    for bi in range(b):
        for h in range(hq):
            hk = h // (hq // hkv)
            qp, kp = q.ptr + (bi * sq * qt + h * d) * size, k.ptr + (bi * skv * kt + hk * d) * size
            vp, op = v.ptr + (bi * skv * vt + hk * dv) * size, o.ptr + (bi * sq * ot + h * dv) * size
            scores = evolve(linear_problem(q.dtype, qp, kp, s_ptr, 0, sq, d, skv, (qt, kt, skv)), alpha=scale)
            out = GemmProblem(q.dtype, m=dv, n=sq, k=skv, a=vp, lda=vt, trans_a=OP_N, b=s_ptr, ldb=skv, trans_b=OP_N,
                              d=op, ldd=ot)  # fmt: skip
            softmax = ctx.kernel("norm", f"softmax_{dt}", (sq,), (row_threads(skv),), [np.uint64(s_ptr)] * 2 + [
                i64(skv), i64(1)])  # fmt: skip
            steps += [LtMatmul(lt, scores), softmax, LtMatmul(lt, out)]
    steps[0].scratch = scratch
    ctx.choices[node.id] = "cublaslt-attention (S = QK^T, softmax, SV)"
    return steps


def _cudnn_steps(
    ctx: LowerCtx,
    node: Node,
    q: DevTensor,
    k: DevTensor,
    v: DevTensor,
    mask: DevTensor | None,
    o: DevTensor,
    scale: float,
    causal: bool,
    strides: list[int],
) -> Steps | None:
    """cuDNN's SDPA for this node, with a key mask as a score bias filled from the mask before it and the
    fully masked query rows zeroed after it (sdpa.py); None (saying why in `ctx.choices`) when cuDNN is
    not chosen or cannot run it."""
    from dif_backend_cuda.sdpa import CudnnSdpa, eligible

    choice = ctx.backend.options["sdpa"]
    if choice == "flash":
        ctx.choices[node.id] = "nvrtc-flash"
        return None
    b, sq, hq, d = q.shape
    skv, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    reason = eligible(q.dtype, d, dv, sq, skv, causal)
    handle = ctx.backend.cudnn() if not reason else None
    if handle is None and not reason:
        reason = f"cuDNN unavailable: {ctx.backend._cudnn_error}"
    if handle is not None and not reason:
        import cupy

        # a key mask's bias: one row broadcast over the queries, else one per query; it lives outside the
        # plan's arena, owned by the SDPA step (so as long as the graph)
        for rows in (1, sq) if mask is not None else (0,):
            bias = cupy.cuda.Memory(b * rows * skv * q.dtype.itemsize) if rows else None
            try:
                step = CudnnSdpa(
                    handle, q.dtype, b, sq, skv, hq, hkv, d, q.ptr, k.ptr, v.ptr, o.ptr, scale, causal, strides,
                    key_bias=bias.ptr if bias is not None else 0, bias_rows=rows,
                )  # fmt: skip
            except Exception as exc:
                reason = f"cuDNN rejected it: {type(exc).__name__}: {str(exc)[:200]}"
                continue
            if bias is None:
                ctx.choices[node.id] = f"cudnn-sdpa ({step.choice})"
                return [step]
            ctx.choices[node.id] = f"cudnn-sdpa ({step.choice}, key mask as a bias of {rows} row(s))"
            step.scratch = bias
            dt, n = q.dtype.value, b * rows * skv
            to_bias = ctx.flat("attention", f"sdpa_mask_bias_{dt}", n, [
                ptr(mask), np.uint64(bias.ptr), i64(n), i64(skv), i64(rows)])  # fmt: skip
            zero_rows = ctx.kernel("attention", f"sdpa_zero_masked_rows_{dt}", (b,), (THREADS,), [
                ptr(mask), ptr(o), i64(sq), i64(skv), i64(hq * dv), i64(strides[3]), np.int32(causal)])  # fmt: skip
            return [to_bias, step, zero_rows]
    if choice == "cudnn":
        raise unsupported(node, f"cuDNN SDPA requested but not possible: {reason}")
    ctx.choices[node.id] = f"nvrtc-flash ({reason})"
    return None
