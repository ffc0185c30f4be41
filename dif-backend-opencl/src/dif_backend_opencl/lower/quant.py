"""OpenCL lowerings of `dif.ops.quant`, the ops the format passes make, onto `kernels/quant.cl` and the GEMM of
`lower/linalg.py`. OpenCL declares `format:int4-group` only (`device.FORMAT_CAPABILITIES`), so the format passes
pick no fp8 / int8 format for it (`dif.passes.quantize`); those ops run when a program holding them is handed to
the backend (a conformance case, a program quantized for another target).

- quantize_rows: one work-group per row: the row's amax, its scale, the saturated quantized row.
- glu_quant / norm_modulate_quant / rms_norm_modulate_quant / concat_glu_quant / act_mul_quant: the unfused
  kernels (glu, norm_modulate, rms_norm_modulate, concat, act_mul) into scratch of x's dtype,
  so the value is rounded exactly as the unfused ops store it, then quantize_rows over the scratch.
- scaled_linear_gated_residual: scaled_linear into the result, then the gated residual over it in place.
- rms_norm_rope_quant: rms_norm_rope's kernel into fp32 scratch (the rotated values unrounded, as the reference
  quantizes them), the scale the norm weights bound (`norm_bound_scale`), the values at it (`quantize_tensor`).
- scaled_linear: the fp32 GEMM with the row and output-channel scales in its epilogue, before the bias. Products
  of i8 / fp8 operands are exact in fp32; i8 sums stay exact while below 2^24, fp8 sums round about as the
  matrix units' accumulators do (`dif.testing.tolerances.FP8_ACCUMULATION`).
- int4_linear: the GEMM whose weight-tile loads unpack the nibbles and apply the group scales: the weight is
  read at 4 bits and never stored wider (no dequantized copy, no pass over it before the GEMM).
"""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.ir.program import Node
from dif.ops.quant import MAX_SHARED_NORMS, QMAX
from dif_backend_opencl.lower.base import Attrs, LowerCtx, Ref, Refs, Steps, lowers
from dif_backend_opencl.lower.fused import (
    lower_act_mul,
    lower_gated_residual,
    lower_norm_modulate,
    lower_rms_norm_modulate,
    lower_rms_norm_rope,
)
from dif_backend_opencl.lower.layout import lower_concat
from dif_backend_opencl.lower.linalg import linear
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


@lowers("concat_glu_quant")
def lower_concat_glu_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (prefix, x), (q, s) = ins, outs
    gated = ctx.scratch((*q.type.shape[:-1], x.type.shape[-1] // 2), x.dtype)
    joined = ctx.scratch(q.type.shape, x.dtype)
    steps = lower_glu(ctx, node, attrs, [x], [gated]) + lower_concat(ctx, node, {"axis": -1}, [prefix, gated], [joined])
    return steps + quantize_rows(ctx, q, s, joined)


@lowers("act_mul_quant")
def lower_act_mul_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (q, s) = outs
    y = ctx.scratch(q.type.shape, ins[0].dtype)
    return lower_act_mul(ctx, node, attrs, ins, [y]) + quantize_rows(ctx, q, s, y)


@lowers("norm_modulate_quant")
def lower_norm_modulate_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (q, s) = outs
    modulated = ctx.scratch(q.type.shape, ins[0].dtype)
    return lower_norm_modulate(ctx, node, attrs, ins, [modulated]) + quantize_rows(ctx, q, s, modulated)


@lowers("rms_norm_modulate_quant")
def lower_rms_norm_modulate_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (q, s) = outs
    modulated = ctx.scratch(q.type.shape, ins[0].dtype)
    return lower_rms_norm_modulate(ctx, node, attrs, ins, [modulated]) + quantize_rows(ctx, q, s, modulated)


@lowers("scaled_linear")
def lower_scaled_linear(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    xq, xs, wq, ws = ins[:4]
    bias = ins[4] if len(ins) > 4 else None
    return linear(ctx, outs[0], xq, wq, bias, scales=(xs, ws))


@lowers("scaled_linear_gated_residual")
def lower_scaled_linear_gated_residual(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    x, gate, *scaled = ins
    (y,) = outs
    return lower_scaled_linear(ctx, node, {}, scaled, [y]) + lower_gated_residual(ctx, node, {}, [x, gate, y], [y])


@lowers("rms_norm_rope_quant")
def lower_rms_norm_rope_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x, w, cos, sin, *bound), (q, s) = ins, outs
    rotated = ctx.scratch(x.type.shape, DType.F32)
    steps = lower_rms_norm_rope(ctx, node, attrs, [x, w, cos, sin], [rotated])
    weights = [w, *bound] + [w] * (MAX_SHARED_NORMS - 1 - len(bound))  # w again changes no maximum
    d = x.type.shape[-1]
    root = np.float32(np.sqrt(np.float32(d)))  # correctly rounded here: OpenCL's sqrt may be 3 ulp off
    args = (*s.ptr(), *(a for t in weights for a in t.full()), np.int32(d), np.float32(attrs["offset"]), root)
    steps += ctx.launch_rows(QUANT, "norm_bound_scale", 1, *args)
    args = (*q.full(), *rotated.full(), *s.ptr(), np.int32(0), np.int64(q.numel))  # e4m3 values, unscaled
    return steps + ctx.launch_1d(QUANT, "quantize_tensor", q.numel, *args)


@lowers("int4_linear")
def lower_int4_linear(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    x, wq, ws = ins[:3]
    bias = ins[3] if len(ins) > 3 else None
    return linear(ctx, outs[0], x, wq, bias, int4=(wq, ws, int(attrs["group_size"])))
