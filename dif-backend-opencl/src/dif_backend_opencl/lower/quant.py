"""OpenCL lowerings of `dif.ops.quant`, the ops the format passes make, onto `kernels/quant.cl` and the GEMM of
`lower/linalg.py`. Correctness first: OpenCL declares no `format:*` capability, so the format passes never pick
these formats for it (`dif.passes.quantize`); they run when a program holding them is handed to the backend
(a conformance case, a program quantized for another target).

- quantize_rows: one work-group per row: the row's amax, its scale, the saturated quantized row.
- glu_quant / norm_modulate_quant: the unfused kernels (glu, norm_modulate) into scratch of x's dtype, so the
  value is rounded exactly as the unfused pair stores it, then quantize_rows over the scratch.
- scaled_linear: the fp32 GEMM with the row and output-channel scales in its epilogue, before the bias. Products
  of i8 / fp8 operands are exact in fp32; i8 sums stay exact while below 2^24, fp8 sums round about as the
  matrix units' accumulators do (`dif.testing.tolerances.FP8_ACCUMULATION`).
- int4_linear: blocks of output rows dequantized into scratch of x's dtype (under the scratch cap), each
  followed by the GEMM of its output columns.
"""

from __future__ import annotations

import numpy as np

from dif.ir.program import Node
from dif.ops.quant import QMAX
from dif_backend_opencl.lower.base import Attrs, LowerCtx, Ref, Refs, Steps, i32s, i64s, lowers
from dif_backend_opencl.lower.fused import lower_norm_modulate
from dif_backend_opencl.lower.linalg import gemm, linear
from dif_backend_opencl.lower.norm import lower_glu

QUANT = "quant"


def quantize_rows(ctx: LowerCtx, q: Ref, s: Ref, x: Ref) -> Steps:
    """q[..., L] (i8 or f8e4m3), s[..., 1] f32 = the symmetric per-row quantization of x[..., L]."""
    length = x.type.shape[-1]
    qmax = np.float32(QMAX[q.dtype.value])
    args = (*q.full(), *s.ptr(), *x.full(), np.int32(length), qmax)
    return ctx.launch_rows(QUANT, "quantize_rows", x.numel // max(length, 1), *args)


@lowers("quantize_rows")
def lower_quantize_rows(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (q, s) = ins, outs
    return quantize_rows(ctx, q, s, x)


@lowers("glu_quant")
def lower_glu_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (q, s) = ins, outs
    gated = ctx.scratch(q.type.shape, x.dtype)
    return lower_glu(ctx, node, attrs, [x], [gated]) + quantize_rows(ctx, q, s, gated)


@lowers("norm_modulate_quant")
def lower_norm_modulate_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (q, s) = outs
    modulated = ctx.scratch(q.type.shape, ins[0].dtype)
    return lower_norm_modulate(ctx, node, attrs, ins, [modulated]) + quantize_rows(ctx, q, s, modulated)


@lowers("scaled_linear")
def lower_scaled_linear(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    xq, xs, wq, ws = ins[:4]
    bias = ins[4] if len(ins) > 4 else None
    return linear(ctx, outs[0], xq, wq, bias, scales=(xs, ws))


@lowers("int4_linear")
def lower_int4_linear(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    x, wq, ws = ins[:3]
    bias = ins[3] if len(ins) > 3 else None
    (y,) = outs
    n_out, k = wq.type.shape[0], x.type.shape[-1]
    group = int(attrs["group_size"])
    m = x.numel // max(k, 1)
    block = max(1, min(n_out, ctx.options.scratch_cap_bytes // max(k * x.dtype.itemsize, 1)))
    scratch = ctx.scratch((block, k), x.dtype)  # every block reuses it: launches run in order
    steps: Steps = []
    for r0 in range(0, n_out, block):
        rows = min(block, n_out - r0)
        w = scratch.view(0, (rows, k))
        steps += ctx.launch_1d(QUANT, "int4_dequant", rows * k, *w.full(), *wq.view(r0 * (k // 2)).ptr(),
                               *ws.view(r0 * (k // group)).full(), *i64s(rows * k), *i32s(k, group))  # fmt: skip
        steps += gemm(ctx, y.view(r0), x, w, m=m, n=rows, k=k, sam=k, sak=1, sbk=1, sbn=k, ldc=n_out,
                      bias=None if bias is None else bias.view(r0), bias_mode=1)  # fmt: skip
    return steps
