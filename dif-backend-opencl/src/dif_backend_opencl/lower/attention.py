"""OpenCL lowerings of `dif.ops.attention`: sdpa (the fused flash kernel of `kernels/attention.cl`, or two
GEMMs + a masked softmax when the head dim is too large for it) and rope (`kernels/elementwise.cl`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dif.dtypes import DType
from dif.ir.program import Node
from dif_backend_opencl.lower.base import Attrs, LowerCtx, Ref, Refs, Steps, i32s, lowers
from dif_backend_opencl.lower.elementwise import EW
from dif_backend_opencl.lower.linalg import gemm

FLASH_BQ = 32


@lowers("rope")
def lower_rope(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x, cos, sin), (y,) = ins, outs
    _, s, h, d = x.type.shape
    r = cos.type.shape[1]
    n = y.numel
    half = np.int32(attrs["mode"] == "half")
    dims = (np.int32(s), np.int32(h), np.int32(d), np.int32(r), half)
    return ctx.launch_1d(EW, "rope", n, *y.full(), *x.full(), *cos.full(), *sin.full(), np.int64(n), *dims)


@lowers("sdpa")
def lower_sdpa(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) > 3 else None
    (o,) = outs
    bsz, sq, hq, d = q.type.shape
    _, skv, hkv, dv = v.type.shape
    scale = float(np.float32(attrs["scale"] or 1.0 / math.sqrt(d)))
    causal = bool(attrs["causal"])
    limit = ctx.options.fused_attention_max_dim
    if d <= limit and dv <= limit:
        gsize = (-(-sq // FLASH_BQ) * FLASH_BQ, bsz * hq)
        args = (*o.full(), *q.full(), *k.full(), *v.full(), *(mask or q).full(), np.int32(mask is not None),
                *i32s(sq, skv, hq, hkv), np.float32(scale), np.int32(causal))  # fmt: skip
        return ctx.launch("attention", "flash_attention", gsize, (FLASH_BQ, 1), *args, defines={"HD": d, "HDV": dv})
    return _sdpa_unfused(ctx, o, q, k, v, mask, scale, causal)


@lowers("sdpa_fp8")
def lower_sdpa_fp8(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    """Emulated (no fp8 matrix units here), with the reference's roundings: q, k, v to the e4m3 grid at their
    tensor scales (fp32 scratch, `kernels/quant.cl`), the unfused attention over them whose softmax rounds its
    numerators to e4m3 (`attn_softmax_fp8`), and the fp32 result rounded to e4m3 at v's scale."""
    q, k, v = ins[:3]
    scales = ctx.scratch((2,), DType.F32)  # the tensor scales of q and k
    steps: Steps = []
    grid: list[Ref] = []
    for i, x in enumerate((q, k)):
        y = ctx.scratch(x.type.shape, DType.F32)
        s = (scales.slot, np.int64(scales.offset + i))
        n = np.int64(x.numel)
        steps += ctx.launch_rows("quant", "tensor_scale", 1, *s, *x.full(), n)
        steps += ctx.launch_1d("quant", "quantize_tensor", x.numel, *y.full(), *x.full(), *s, np.int32(1), n)
        grid.append(y)  # q and k times their scales
    return steps + _fp8_attention(ctx, attrs, grid[0], grid[1], v, ins[3] if len(ins) > 3 else None, outs[0])


@lowers("sdpa_fp8_qk")
def lower_sdpa_fp8_qk(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    """`lower_sdpa_fp8` with q and k as their producers quantized them: their e4m3 values times their scales
    (fp32 scratch), then the same attention over them and v."""
    steps: Steps = []
    grid: list[Ref] = []
    for x, s in ((ins[0], ins[1]), (ins[2], ins[3])):
        y = ctx.scratch(x.type.shape, DType.F32)
        steps += ctx.launch_1d("quant", "scale_tensor", x.numel, *y.ptr(), *x.full(), *s.ptr(), np.int64(x.numel))
        grid.append(y)
    return steps + _fp8_attention(ctx, attrs, grid[0], grid[1], ins[4], ins[5] if len(ins) > 5 else None, outs[0])


def _fp8_attention(ctx: LowerCtx, attrs: Attrs, q: Ref, k: Ref, v: Ref, mask: Ref | None, o: Ref) -> Steps:
    """The fp8 attention over q and k on the e4m3 grid times their scales (fp32): v's e4m3 values at its tensor
    scale, the unfused attention whose softmax carries that scale, the result rounded to e4m3 at it."""
    scale = float(np.float32(attrs["scale"] or 1.0 / math.sqrt(q.type.shape[3])))
    sv = ctx.scratch((1,), DType.F32)
    v8 = ctx.scratch(v.type.shape, DType.F32)
    n = np.int64(v.numel)
    steps = ctx.launch_rows("quant", "tensor_scale", 1, *sv.ptr(), *v.full(), n)
    steps += ctx.launch_1d("quant", "quantize_tensor", v.numel, *v8.full(), *v.full(), *sv.ptr(), np.int32(0), n)
    out = ctx.scratch(o.type.shape, DType.F32)
    steps += _sdpa_unfused(ctx, out, q, k, v8, mask, scale, bool(attrs["causal"]), v_scale=sv.ptr())
    return steps + ctx.launch_1d("quant", "fp8_round_out", o.numel, *o.full(), *out.ptr(), *sv.ptr(), np.int64(o.numel))


def _sdpa_unfused(
    ctx: LowerCtx, o: Ref, q: Ref, k: Ref, v: Ref, mask: Ref | None, scale: float, causal: bool,
    v_scale: tuple[Any, np.int64] | None = None,
) -> Steps:  # fmt: skip
    """scores = q k^T (GEMM), masked softmax in place, o = p v (GEMM); per batch element and block
    of kv heads so the fp32 scores stay under the scratch cap. Heads are split (kv head, repeat)
    so GQA is two batch dims of the GEMMs rather than a copy. With `v_scale` (the scale of v's e4m3 values:
    sdpa_fp8), the softmax rounds its numerators to e4m3 and carries that scale (`attn_softmax_fp8`)."""
    bsz, sq, hq, d = q.type.shape
    _, skv, hkv, dv = v.type.shape
    rep = hq // hkv
    per_kv = rep * sq * skv * 4
    chunk = max(1, min(hkv, ctx.options.scratch_cap_bytes // max(per_kv, 1)))
    steps: Steps = []
    for b in range(bsz):
        for h0 in range(0, hkv, chunk):
            kvc = min(chunk, hkv - h0)
            s = ctx.scratch((kvc, rep, sq, skv), DType.F32)
            qv = q.view((b * sq * hq + h0 * rep) * d)
            kv_ = k.view((b * skv * hkv + h0) * d)
            steps += gemm(ctx, s, qv, kv_, m=sq, n=skv, k=d, sam=hq * d, sak=1, sbk=1, sbn=hkv * d, ldc=skv,
                          batch=[(kvc, rep * d, d, rep * sq * skv), (rep, d, 0, sq * skv)])  # fmt: skip
            mref = mask.view(b * skv) if mask is not None else q
            args = (*s.ptr(), *i32s(sq, skv), np.float32(scale), *mref.full(), *i32s(mask is not None, causal))
            if v_scale is None:
                steps += ctx.launch_rows("norm", "attn_softmax", kvc * rep * sq, *args)
            else:
                steps += ctx.launch_rows("norm", "attn_softmax_fp8", kvc * rep * sq, *args, *v_scale)
            ov = o.view((b * sq * hq + h0 * rep) * dv)
            vv = v.view((b * skv * hkv + h0) * dv)
            steps += gemm(ctx, ov, s, vv, m=sq, n=dv, k=skv, sam=skv, sak=1, sbk=hkv * dv, sbn=1, ldc=hq * dv,
                          batch=[(kvc, rep * sq * skv, dv, rep * dv), (rep, sq * skv, 0, dv)])  # fmt: skip
    return steps
