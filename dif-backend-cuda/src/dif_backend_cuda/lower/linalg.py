"""CUDA lowerings of `dif.ops.linalg` (linear, matmul): cuBLASLt when the backend has it and the problem
fits, else the NVRTC GEMM of `kernels/linalg.cu` (`linear_steps` also serves the fused `linear_add`). The path
taken per node is recorded in `LowerCtx.choices` (shown by the executable and the smoke script).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from attrs import evolve

from dif.ir.program import Node
from dif_backend_cuda.lower.base import (
    FLOATS,
    LOWERINGS,
    MAX_GRID_Z,
    TILE,
    Attrs,
    DevTensor,
    LowerCtx,
    Steps,
    Ts,
    broadcast_strides,
    collapse,
    i64,
    lowering,
    need,
    ptr,
    row_stride,
    unsupported,
)


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
    ctx.choices[node.id] = f"cublaslt ({step.tune(ctx.backend.stream)})"
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
    return ctx.kernel("linalg", f"gemm_{dt}", grid, (256,), args)


def linear_steps(
    ctx: LowerCtx, node: Node, x: DevTensor, w: DevTensor, bias: DevTensor | None, y: DevTensor,
    residual: DevTensor | None = None,
) -> Steps:  # fmt: skip
    """y = x @ w^T + bias (+ residual, of y's shape): one cuBLASLt GEMM (the residual as C with beta 1), else
    the NVRTC GEMM (then, with a residual, the broadcasting add kernel over y in place)."""
    dt = need(node, x.dtype, FLOATS)
    k, out = x.shape[-1], w.shape[0]
    rows = x.numel // k if k else 0
    if k == 0:
        raise unsupported(node, "zero-length contraction")
    from dif_backend_cuda.gemm import linear_problem

    lds = (row_stride(node, x, 1), row_stride(node, w, 1), row_stride(node, y, 1))
    r_ptr, ldr = (residual.ptr, row_stride(node, residual, 1)) if residual is not None else (0, 0)
    problem = linear_problem(x.dtype, x.ptr, w.ptr, y.ptr, ptr(bias).item(), rows, k, out, lds, residual=r_ptr, ldr=ldr)
    step = _lt_step(ctx, node, problem)
    if step is not None:
        return [step]
    ldx, ldw, ldy = lds
    strides = (ldx, 1, 1, ldw, ldy)
    steps = [_gemm_kernel(ctx, node, dt, x.ptr, w.ptr, ptr(bias).item(), y.ptr, [1, 1, 0, 0], 1, rows, out, k, strides)]
    if residual is not None:
        # y = add(r, y) exactly as the unfused pair: the product rounded to y's dtype, then the add kernel in place
        # (each element is read, then written, by one thread); r never shares y's bytes: the planner keeps both
        # live at this node
        ctx.choices[node.id] = ctx.choices[node.id].replace("nvrtc-gemm", "nvrtc-gemm + add", 1)
        steps += LOWERINGS["add"](ctx, evolve(node, op="add"), {}, [residual, y], [y])
    return steps


@lowering("linear")
def _linear(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    bias = ins[2] if len(ins) > 2 else None
    return linear_steps(ctx, node, ins[0], ins[1], bias, outs[0])


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
