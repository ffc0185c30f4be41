"""CUDA lowerings of `dif.ops.quant`, the ops the format passes make, onto `kernels/quant.cu` and cuBLASLt
(`gemm_quant`). The path each node takes is recorded in `LowerCtx.choices`.

- norm_modulate_quant / glu_quant / concat_glu_quant / act_mul_quant: one kernel normalizes and modulates (or
  gates), rounds to x's dtype, takes the row's amax (over the prefix and the gated half for concat_glu_quant)
  and writes the quantized row and its scale: the W8A8 GEMM's input is never re-read to be quantized. With the
  backend's `rows="registers"` (DIF_CUDA_ROWS, the default), these and quantize_rows over bf16 / f16 rows (a
  multiple of 8 long, 16-byte aligned) hold the row in registers (`*_vec_*`: 16-byte loads, one read of the row,
  no shared memory; norm_modulate_quant a warp per row where the row is 256 * N long); otherwise the kernels that
  stage it in shared memory run. Those are latency-bound: on an H100 (stop 27, same call) klein 9B's fp8 forward
  took 89.4 ms with them, 83.5 ms with the register-resident kernels (klein 4B 44.9 / 41.7 ms).
- scaled_linear: fp8-e4m3 on cuBLASLt with the scales as outer-vector epilogue scales (one call, bf16 out);
  int8 (and fp8 where this cuBLASLt has no outer-vector scales) as raw-product GEMMs in blocks of rows plus the
  scaled epilogue kernel; the portable tile GEMM when cuBLASLt is absent or refuses (the reasons recorded).
- scaled_linear_gated_residual: with one gate for every row, the fp8 GEMM above with the gate in its output-channel
  scales and bias (a kernel writes them) and the residual as C; otherwise scaled_linear and the gated residual
  in place.
- int4_linear: with the backend's `int4="mma"` (DIF_CUDA_INT4) on sm_80+ over bf16 / f16 activations, a
  tensor-core GEMM (mma.sync) that unpacks each K slice of the weights into shared memory with the group scales
  applied; otherwise the portable tile GEMM whose weight loads unpack them. Either way the weights are
  dequantized inside the GEMM, never in a pass of their own.
- quantize_rows: a pass over the activations, for a GEMM input no quantizing producer makes (an attention output).
- rms_norm_rope_quant: rms_norm_rope's kernels (kernels/fused.cu) writing e4m3 at the scale the norm weights bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dif.dtypes import DType
from dif.ir.program import Node
from dif.ops.quant import MAX_SHARED_NORMS
from dif_backend_cuda.lower.base import (
    DEFAULT_SHARED,
    FLOATS,
    LOWERINGS,
    TILE,
    Attrs,
    LowerCtx,
    Steps,
    Ts,
    broadcast_strides,
    f32,
    i64,
    lowering,
    need,
    ptr,
    row_stride,
    row_threads,
    unsupported,
)
from dif_backend_cuda.lower.fused import norm_rope_kernel

QUANT = (DType.F8E4M3, DType.I8)
FORMAT_CAPABILITIES = ("format:fp8-e4m3", "format:int8", "format:int4-group")
"""What the profile declares (dif.formats `implemented_by`): the lowerings below exist; whether a format is legal
on the device (fp8 / int8 matrix units, the f8e4m3 dtype) is the profile's dtypes and tensor-core formats."""
SCRATCH_ATTR = "_dif_int8_scratch"


def _rows(t: Any) -> tuple[int, int]:
    k = t.shape[-1]
    return (t.numel // k if k else 0), k


ROW_CHUNKS = 4  # kernels/quant.cu: chunks of 8 values a thread of the register-resident row kernels holds


VEC_THREADS = {"quantize_rows": 1024, "norm_modulate_quant": 512, "glu_quant": 512, "act_mul_quant": 512}
"""The most threads a block of each register-resident kernel may have: a block of 1024 threads gets at most 64
registers a thread, which `quantize_rows_vec_*` fits (47-48 on sm_90, NVRTC 13) and norm_modulate_quant_vec_*
does not (66-72); at 512 they may use 128. glu_quant_vec_* (56) and act_mul_quant_vec_* (48-51) fit since their
divisions became corrected products (common.cuh `Divisor`); `perf/probe_elementwise.py` times them at 1024."""


NMQ_WARP_CHUNKS = (4, 8, 12, 16)
"""Rows of 256 * N half-precision values (N here) take `norm_modulate_quant_warp<N>`: a warp per row, every
reduction a shuffle. It holds the row in registers in storage precision, 167 registers a thread at N = 16 (bf16,
sm_90, NVRTC 13; f16 189), so blocks of `NMQ_WARPS` warps: 12 warps fit an SM where blocks of 8 would fit only
8. Longer rows (N = 24 would take 221 registers, 9 warps an SM) take the block-per-row kernel."""
NMQ_WARPS = 4


def _row_vector_threads(
    ctx: LowerCtx, kernel: str, length: int, addrs: list[tuple[int, int]], strides: tuple[int, ...] = ()
) -> int:
    """Threads per row of the register-resident kernels (`*_vec_*`, 16-byte loads), about two chunks of 8 each;
    0 where they do not run: the backend's `rows` option is not 'registers' (DIF_CUDA_ROWS), a row is not a
    multiple of 8 or longer than `VEC_THREADS[kernel]` threads' chunks, an operand address (with its alignment
    in bytes) or a row stride (in elements of a half-precision operand) is not aligned."""
    if ctx.backend.options.get("rows") != "registers":
        return 0
    chunks = length // 8
    threads = min(VEC_THREADS[kernel], max(32, -(-chunks // 2 // 32) * 32))
    if length % 8 or -(-chunks // threads) > ROW_CHUNKS:
        return 0
    if any(a % align for a, align in addrs) or any(s % 8 for s in strides):
        return 0
    return threads


def _staged_row_bytes(ctx: LowerCtx, node: Node, length: int) -> int:
    """The dynamic shared memory of a kernel staging a row of `length` floats once; `unsupported` beyond what
    the device allows a block."""
    shared = 4 * length
    limit = max(DEFAULT_SHARED, int(ctx.backend.props.get("smem_optin", 0)))
    if shared > limit:
        raise unsupported(node, f"a row of {length} needs {shared} B of shared memory (the device allows {limit})")
    return shared


@lowering("quantize_rows")
def _quantize_rows(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (q, s) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    qt = need(node, q.dtype, QUANT)
    rows, length = _rows(x)
    args = [ptr(x), ptr(q), ptr(s), i64(length)]
    addrs = [(x.ptr, 16), (q.ptr, 8)]
    threads = 0 if x.dtype == DType.F32 else _row_vector_threads(ctx, "quantize_rows", length, addrs)
    if threads:  # the row in registers, one read of it
        return [ctx.kernel("quant", f"quantize_rows_vec_{dt}_{qt}", (rows,), (threads,), args)]
    return [ctx.kernel("quant", f"quantize_rows_{dt}_{qt}", (rows,), (row_threads(length),), args)]


@lowering("norm_modulate_quant")
def _norm_modulate_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    return _modulated_rows(ctx, node, attrs["kind"] == "rms", ins, outs, f32(attrs["eps"]))


@lowering("rms_norm_modulate_quant")
def _rms_norm_modulate_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, w, sc, sh) = ins
    return _modulated_rows(ctx, node, True, [x, sc, sh], outs, f32(attrs["eps"]), (w, f32(attrs["offset"])))


def _modulated_rows(
    ctx: LowerCtx, node: Node, is_rms: bool, ins: Ts, outs: Ts, eps: Any, weight: tuple[Any, Any] | None = None
) -> Steps:
    """norm_modulate_quant and (with `weight`: the norm's weight and its offset) rms_norm_modulate_quant: one
    kernel family, the norm's value multiplied by the weight before it is rounded. The warp-per-row kernel runs
    the former alone."""
    (x, sc, sh), (q, s) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    qt = need(node, q.dtype, QUANT)
    rows, length = _rows(x)
    lead = list(x.shape[:-1])
    ss, ts = broadcast_strides(sc.shape, x.shape), broadcast_strides(sh.shape, x.shape)
    meta = ctx.meta([len(lead), *lead, *ss[:-1], *ts[:-1]])
    if weight is None:
        family, head, tail = "norm_modulate_quant", [ptr(x)], [eps, np.int32(is_rms)]
    else:
        w, offset = weight
        family, head, tail = "rms_norm_modulate_quant", [ptr(x), ptr(w)], [eps, offset]
    types = f"{dt}_{qt}" if weight is None else f"{dt}_{need(node, weight[0].dtype, FLOATS)}_{qt}"
    threads = 0
    if x.dtype != DType.F32 and ss[-1] == ts[-1] == 1:
        addrs = [(t.ptr, 16) for t in (x, sc, sh)] + [(q.ptr, 8)] + ([] if weight is None else [(weight[0].ptr, 16)])
        threads = _row_vector_threads(ctx, "norm_modulate_quant", length, addrs, (*ss[:-1], *ts[:-1]))
    warp = weight is None and length % 256 == 0 and length // 256 in NMQ_WARP_CHUNKS
    if threads and warp:  # a warp per row, no barrier
        args = [ptr(x), ptr(sc), ptr(sh), ptr(q), ptr(s), meta, i64(rows), *tail]
        name = f"{family}_warp{length // 256}_{types}"
        return [ctx.kernel("quant", name, (-(-rows // NMQ_WARPS),), (32 * NMQ_WARPS,), args)]
    if threads:  # the row in registers: one read of it, no shared memory
        args = [*head, ptr(sc), ptr(sh), ptr(q), ptr(s), meta, i64(length), *tail]
        return [ctx.kernel("quant", f"{family}_vec_{types}", (rows,), (threads,), args)]
    shared = _staged_row_bytes(ctx, node, length)
    args = [*head, ptr(sc), ptr(sh), ptr(q), ptr(s), meta, i64(length), i64(ss[-1]), i64(ts[-1]), *tail]
    block = min(1024, row_threads(length))
    return [ctx.kernel("quant", f"{family}_{types}", (rows,), (block,), args, shared)]


@lowering("glu_quant")
def _glu_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    return _glu_rows(ctx, node, attrs, None, ins[0], outs)


@lowering("concat_glu_quant")
def _concat_glu_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    return _glu_rows(ctx, node, attrs, ins[0], ins[1], outs)


def _glu_rows(ctx: LowerCtx, node: Node, attrs: Attrs, prefix: Any | None, x: Any, outs: Ts) -> Steps:
    """glu_quant (no prefix) and concat_glu_quant: one kernel family, the prefix's width 0 for the former."""
    q, s = outs
    dt = need(node, x.dtype, FLOATS)
    qt = need(node, q.dtype, QUANT)
    rows, length = _rows(q)
    p = 0 if prefix is None else prefix.shape[-1]
    h = length - p
    # x (and the prefix) may be pitched views (PITCHED_ROWS): a part of a fused projection's output, not copied
    pitches = (0 if prefix is None else row_stride(node, prefix, 1), row_stride(node, x, 1))
    if row_stride(node, q, 1) != length or row_stride(node, s, 1) != 1:
        raise unsupported(node, "its quantized rows and their scales must be contiguous")
    act = f"{attrs['act']}_{dt}_{qt}"
    args = [ptr(prefix), i64(p), ptr(x), ptr(q), ptr(s), i64(h), np.int32(attrs["gated_half"] == "first")]
    args += [i64(pitch) for pitch in pitches]
    threads = 0
    if x.dtype != DType.F32 and h % 8 == 0:  # p % 8 too: the row length's check below
        addrs = [(x.ptr, 16), (q.ptr, 8)] + ([] if prefix is None else [(prefix.ptr, 16)])
        threads = _row_vector_threads(ctx, "glu_quant", length, addrs, pitches)
    if threads:  # the row in registers, one read of the input
        return [ctx.kernel("quant", f"glu_quant_vec_{act}", (rows,), (threads,), args)]
    shared = _staged_row_bytes(ctx, node, length)
    return [ctx.kernel("quant", f"glu_quant_{act}", (rows,), (min(1024, row_threads(length)),), args, shared)]


@lowering("act_mul_quant")
def _act_mul_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (g, u), (q, s) = ins, outs
    dt = need(node, g.dtype, FLOATS)
    qt = need(node, q.dtype, QUANT)
    rows, length = _rows(g)
    name = f"{attrs['act']}_{dt}_{qt}"
    args = [ptr(g), ptr(u), ptr(q), ptr(s), i64(length)]
    threads = 0
    if g.dtype != DType.F32:
        threads = _row_vector_threads(ctx, "act_mul_quant", length, [(g.ptr, 16), (u.ptr, 16), (q.ptr, 8)])
    if threads:  # the row in registers, one read of each operand
        return [ctx.kernel("quant", f"act_mul_quant_vec_{name}", (rows,), (threads,), args)]
    shared = _staged_row_bytes(ctx, node, length)
    return [ctx.kernel("quant", f"act_mul_quant_{name}", (rows,), (min(1024, row_threads(length)),), args, shared)]


@lowering("rms_norm_rope_quant")
def _rms_norm_rope_quant(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """rms_norm_rope's kernels writing e4m3 at the scale the norm weights bound (kernels/fused.cu): w and up to
    three `bound` weights, the scale written by the tensor's first warp."""
    (y, scale), bound = outs, ins[4:]
    need(node, ins[0].dtype, (DType.BF16, DType.F16))
    if any(b.dtype != ins[1].dtype for b in bound):
        raise unsupported(node, "the bound weights' dtype differs from w's")
    extra = [ptr(b) for b in bound] + [np.uint64(0)] * (MAX_SHARED_NORMS - 1 - len(bound))
    return [norm_rope_kernel(ctx, node, attrs, ins[:4], y, "rms_norm_rope_q8", [*extra, ptr(scale)])]


def _lt(ctx: LowerCtx, node: Node) -> Any | None:
    """The backend's cuBLASLt context, or None (the reason recorded) when the portable GEMM must run."""
    if ctx.backend.options["gemm"] == "nvrtc":
        ctx.choices[node.id] = "nvrtc scaled tile GEMM (gemm=nvrtc)"
        return None
    lt = ctx.backend.lt()
    if lt is None:
        if ctx.backend.options["gemm"] == "cublaslt":
            raise unsupported(node, f"cuBLASLt requested but unavailable: {ctx.backend._lt_error}")
        ctx.choices[node.id] = f"nvrtc scaled tile GEMM (cuBLASLt unavailable: {ctx.backend._lt_error})"
    return lt


def _scratch(ctx: LowerCtx) -> int:
    """The backend's scratch of the blocked W8A8 GEMMs and of the gated channel scales of
    scaled_linear_gated_residual (`gemm_quant.SCRATCH_BYTES`, outside the plan's arena, allocated once per
    backend): steps run one after another on the backend's stream, and each node's use ends with its steps."""
    mem = getattr(ctx.backend, SCRATCH_ATTR, None)
    if mem is None:
        import cupy

        from dif_backend_cuda.gemm_quant import SCRATCH_BYTES

        mem = cupy.cuda.Memory(SCRATCH_BYTES)
        setattr(ctx.backend, SCRATCH_ATTR, mem)
    return int(mem.ptr)


def _blocked_steps(ctx: LowerCtx, lt: Any, ot: str, xq: Any, xs: Any, wq: Any, ws: Any, bias: Any, y: Any) -> Steps:
    """Raw-product GEMMs (int32 for int8, fp32 for fp8) over blocks of rows, each followed by the scaled epilogue."""
    from dif_backend_cuda.gemm_quant import BlockMatmul, block_plans, block_rows

    rows, k = _rows(xq)
    out = wq.shape[0]
    scratch = _scratch(ctx)
    block = block_rows(rows, out)
    worst = xq.at(block * k) if rows > block else xq.ptr  # the least aligned block start decides the algorithm
    plans = block_plans(lt, xq.dtype, rows, k, out, (wq.ptr, worst, scratch))
    acc = "i32" if xq.dtype == DType.I8 else "f32"
    steps: Steps = []
    for start in range(0, rows, block):
        n = min(block, rows - start)
        steps.append(BlockMatmul(plans[n], wq.ptr, xq.at(start * k), scratch, acc == "i32"))
        args = [np.uint64(scratch), np.uint64(xs.at(start)), ptr(ws), ptr(bias), np.uint64(y.at(start * out)),
                i64(n), i64(out)]  # fmt: skip
        steps.append(ctx.flat("quant", f"scaled_epilogue_{acc}_{ot}", n * out, args))
    return steps


@lowering("scaled_linear")
def _scaled_linear(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    xq, xs, wq, ws = ins[:4]
    bias = ins[4] if len(ins) > 4 else None
    (y,) = outs
    qt = need(node, xq.dtype, QUANT)
    ot = need(node, y.dtype, FLOATS)
    rows, k = _rows(xq)
    out = wq.shape[0]
    if k == 0:
        raise unsupported(node, "zero-length contraction")
    lt = _lt(ctx, node)
    refused: list[str] = []
    if lt is not None and xq.dtype == DType.F8E4M3:
        try:
            from dif_backend_cuda.gemm_quant import Fp8ScaledMatmul

            step = Fp8ScaledMatmul(lt, y.dtype, rows, k, out, xq.ptr, xs.ptr, wq.ptr, ws.ptr, ptr(bias).item(), y.ptr)
            ctx.choices[node.id] = "cublaslt fp8 (outer-vector scales and bias in the epilogue)"
            return [step]
        except Exception as exc:  # an older cuBLASLt: no outer-vector scales
            refused.append(f"outer-vector scales: {type(exc).__name__}: {exc}")
    if lt is not None:
        try:
            steps = _blocked_steps(ctx, lt, ot, xq, xs, wq, ws, bias, y)
            why = f" ({'; '.join(refused)})" if refused else ""
            ctx.choices[node.id] = f"cublaslt {qt} raw products, {len(steps) // 2} row block(s) + scaled epilogue{why}"
            return steps
        except Exception as exc:
            refused.append(f"{type(exc).__name__}: {exc}")
        if ctx.backend.options["gemm"] == "cublaslt":
            raise unsupported(node, f"cuBLASLt rejected the W8A8 GEMM: {'; '.join(refused)}")
        ctx.choices[node.id] = f"nvrtc scaled tile GEMM (cuBLASLt: {'; '.join(refused)})"
    grid = (-(-out // TILE), -(-rows // TILE))
    args = [ptr(xq), ptr(xs), ptr(wq), ptr(ws), ptr(bias), ptr(y), i64(rows), i64(out), i64(k)]
    return [ctx.kernel("quant", f"scaled_gemm_{qt}_{ot}", grid, (256,), args)]


@lowering("scaled_linear_gated_residual")
def _scaled_linear_gated_residual(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """x + gate * scaled_linear(..). With a gate shared by every row and fp8 operands: `gate_channels_*` writes the
    output-channel scales and the bias times the gate (a few KiB), then one cuBLASLt fp8 GEMM with x as C (beta
    1): the product is never written apart. Otherwise the scaled_linear into y and the gated residual over it in
    place; the choice says why."""
    x, gate, xq, xs, wq, ws = ins[:6]
    bias = ins[6] if len(ins) > 6 else None
    (y,) = outs
    rows, k = _rows(xq)
    out = wq.shape[0]
    why = None
    if xq.dtype != DType.F8E4M3:
        why = f"{xq.dtype.value} operands (the fused epilogue is the fp8 GEMM's)"
    elif gate.numel != out:
        why = f"a gate of shape {gate.shape}, not one shared by every row"
    elif x.pitched or y.pitched:
        why = "a residual or result that is a pitched view"
    lt = _lt(ctx, node) if why is None else None
    if why is None and lt is None:
        why = "without cuBLASLt"
    if lt is not None:
        from dif_backend_cuda.gemm_quant import Fp8ScaledMatmul

        ot = need(node, y.dtype, FLOATS)
        gated_scales = _scratch(ctx)  # the bias after the scales, 256-byte aligned; a few KiB of 64 MiB
        gated_bias = gated_scales + -(-4 * out // 256) * 256 if bias is not None else 0
        try:
            step = Fp8ScaledMatmul(lt, y.dtype, rows, k, out, xq.ptr, xs.ptr, wq.ptr, gated_scales, gated_bias,
                                   y.ptr, residual=x.ptr)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the unfused steps run it instead, saying why
            why = f"cuBLASLt refused the residual as C: {type(exc).__name__}: {str(exc)[:200]}"
        else:
            args = [ptr(ws), ptr(gate), ptr(bias), np.uint64(gated_scales), np.uint64(gated_bias), i64(out)]
            ctx.choices[node.id] = "cublaslt fp8 (the gate in the outer-vector scales, the residual as C)"
            return [ctx.flat("quant", f"gate_channels_{ot}", out, args), step]
    steps = _scaled_linear(ctx, node, {}, [xq, xs, wq, ws, *([bias] if bias is not None else [])], [y])
    steps += LOWERINGS["gated_residual"](ctx, node, {}, [x, gate, y], [y])
    ctx.choices[node.id] = f"{ctx.choices.get(node.id, 'scaled_linear')}, then the gated residual in place ({why})"
    return steps


@lowering("int4_linear")
def _int4_linear(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    x, wq, ws = ins[:3]
    bias = ins[3] if len(ins) > 3 else None
    (y,) = outs
    dt = need(node, x.dtype, FLOATS)
    rows, k = _rows(x)
    out, group = wq.shape[0], int(attrs["group_size"])
    args = [ptr(x), ptr(wq), ptr(ws), ptr(bias), ptr(y), i64(rows), i64(out), i64(k), i64(group)]
    why_not = _int4_mma_refusal(ctx, dt, x, wq)
    if why_not is None:
        grid = (-(-out // MMA_TILE), -(-rows // MMA_TILE))
        ctx.choices[node.id] = f"nvrtc int4 tensor-core GEMM (groups of {group} unpacked in shared memory)"
        return [ctx.kernel("quant", f"int4_mma_{dt}", grid, (256,), args)]
    grid = (-(-out // TILE), -(-rows // TILE))
    ctx.choices[node.id] = f"nvrtc int4 tile GEMM (groups of {group} dequantized in the tile loads; {why_not})"
    return [ctx.kernel("quant", f"int4_gemm_{dt}", grid, (256,), args)]


MMA_TILE = 128
"""The output tile of `int4_mma_*` (128 x 128 per block of 8 warps). Its K slices of 32 each lie in one scale
group: every group size the op allows (32, 64, 128) is a multiple of 32."""


def _int4_mma_refusal(ctx: LowerCtx, dt: str, x: Any, wq: Any) -> str | None:
    """Why `int4_mma_*` (mma.sync over bf16 / f16, sm_80+) cannot run this int4_linear; None when it can."""
    cc = int(ctx.backend.props["major"]) * 10 + int(ctx.backend.props["minor"])
    if ctx.backend.options.get("int4") != "mma":
        return "DIF_CUDA_INT4=tile"
    if dt not in ("bf16", "f16"):
        return f"the tensor-core kernel takes bf16 / f16 activations, not {dt}"
    if cc < 80:
        return f"mma.sync m16n8k16 needs sm_80, this GPU is sm_{cc}"
    if x.ptr % 16 or wq.ptr % 8:
        return "an operand is misaligned for the kernel's 16-byte activation or 8-byte weight loads"
    return None
