"""CUDA lowerings of `dif.ops.attention`: sdpa (cuDNN when eligible, cuBLASLt GEMMs for very wide heads,
else the NVRTC flash kernel of `kernels/attention.cu`; the path is recorded in `LowerCtx.choices`) and
rope (the rotation kernels of `kernels/norm.cu`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from attrs import evolve, frozen

from dif.dtypes import DType
from dif.ir.program import Node
from dif_backend_cuda.lower.base import (
    FLOATS,
    THREADS,
    Attrs,
    DevTensor,
    Launch,
    LowerCtx,
    Steps,
    Ts,
    f32,
    i64,
    lowering,
    need,
    ptr,
    row_stride,
    row_threads,
    unsupported,
)


@lowering("rope")
def _rope(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, c, s), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    if c.dtype != s.dtype:
        raise unsupported(node, f"cos {c.dtype.value} and sin {s.dtype.value} differ in dtype")
    ct = need(node, c.dtype, FLOATS)
    _b, seq, heads, dim = x.shape
    rows = y.numel // dim
    tx = min(THREADS, -(-((dim + 1) // 2) // 32) * 32)  # threads over channel pairs
    ty = max(1, THREADS // tx)  # rows per block
    grid = (max(1, min(-(-rows // ty), ctx.sm_count * 32)),)
    pairs = np.int32(attrs["mode"] == "pairs")
    args = [ptr(x), ptr(c), ptr(s), ptr(y), i64(rows), i64(seq), i64(heads), i64(dim), i64(c.shape[1]), pairs]
    return [ctx.kernel("norm", f"rope_{dt}_{ct}", grid, (tx, ty), args)]


FA_WARPS, FA_TILE, FA_MAX_DV, FA_WIDE_DV = 4, 32, 256, 512


@lowering("sdpa")
def _sdpa(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    q, k, v = ins[0], ins[1], ins[2]
    mask = ins[3] if len(ins) > 3 else None
    (o,) = outs
    need(node, q.dtype, FLOATS)
    b, sq, hq, d = q.shape
    skv, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    scale = attrs["scale"] or 1.0 / math.sqrt(d)
    causal = bool(attrs["causal"])
    strides = [row_stride(node, t, 2) for t in (q, k, v, o)]
    cudnn_steps = _cudnn_steps(ctx, node, q, k, v, mask, o, scale, causal, strides)
    if cudnn_steps is not None:
        if mask is None and sq * skv <= FLASH_TRIED_SCORES and dv <= FA_MAX_DV:
            problem = (q.dtype.value, b, sq, skv, hq, hkv, d, dv, scale, causal, *strides)
            flash = partial(_flash, ctx, node, q, k, v, None, o, scale, causal, strides)
            return _faster_of_cudnn_and_flash(ctx, node, cudnn_steps, flash, problem)
        return cudnn_steps
    if dv > FA_MAX_DV and mask is None and not causal:
        steps = _sdpa_by_gemms(ctx, node, q, k, v, o, scale, strides)
        if steps is not None:
            return steps
    return [_flash(ctx, node, q, k, v, mask, o, scale, causal, strides)]


FP8_BLOCKS = 2  # per SM: blocks of each quantization pass of sdpa_fp8 (and partial maxima per tensor)


@frozen
class QuantizedQK:
    """q and k as their producers quantized them (`sdpa_fp8_qk`): dense e4m3 tensors and a [1] f32 scale each."""

    q8: DevTensor
    q_scale: DevTensor
    k8: DevTensor
    k_scale: DevTensor


@lowering("sdpa_fp8")
def _sdpa_fp8(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """cuDNN's fp8 flash attention (sdpa.py `CudnnSdpaFp8`) between passes of kernels/quant.cu: the amax of
    q, k and v (per-block maxima), their dense e4m3 copies with the scales, and after the attention its e4m3
    output (at v's scale) dequantized into the node's output. A key mask is met as the bf16 path meets it
    (`_cudnn_over_attended_keys`): the attended keys' e4m3 rows gathered to the front, cuDNN's padding mask
    over them, the fully masked query rows zeroed. Where cuDNN's fp8 attention cannot run the node, the run
    dtype's sdpa does, and the plan's choice says why."""
    q, k, v = ins[0], ins[1], ins[2]
    mask = ins[3] if len(ins) > 3 else None
    need(node, q.dtype, (DType.BF16, DType.F16))
    scale = attrs["scale"] or 1.0 / math.sqrt(q.shape[3])
    why = _fp8_attention_problem(ctx, q, k, v, mask, bool(attrs["causal"]))
    steps = why or _cudnn_fp8_steps(ctx, node, scale, bool(attrs["causal"]), q, k, v, mask, outs[0])
    if isinstance(steps, str):  # more exact than the op's fp8 arithmetic, never less: the choice says so
        steps, why = _sdpa(ctx, node, attrs, ins, outs), steps
        ctx.choices[node.id] = f"{ctx.choices.get(node.id, 'sdpa')} in {q.dtype.value}, not fp8: {why}"
    return steps


@lowering("sdpa_fp8_qk")
def _sdpa_fp8_qk(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """`_sdpa_fp8`'s steps with q and k as their producers quantized them (`rms_norm_rope_quant`): the passes
    before cuDNN's attention find v's amax and write its e4m3 copy alone, and copy q's and k's scales into the
    attention's scale buffer. Where cuDNN's fp8 attention cannot run the node, q and k are dequantized into
    scratch and the run dtype's sdpa runs, and the plan's choice says why."""
    q8, qs, k8, ks, v = ins[:5]
    mask = ins[5] if len(ins) > 5 else None
    need(node, v.dtype, (DType.BF16, DType.F16))
    if q8.pitched or k8.pitched:
        raise unsupported(node, "q and k quantized as views inside wider buffers")
    given = QuantizedQK(q8, qs, k8, ks)
    q, k = (evolve(t, dtype=v.dtype) for t in (q8, k8))  # their shapes, for the checks and the cuDNN graph
    scale = attrs["scale"] or 1.0 / math.sqrt(q.shape[3])
    why = _fp8_attention_problem(ctx, q, k, v, mask, bool(attrs["causal"]))
    steps = why or _cudnn_fp8_steps(ctx, node, scale, bool(attrs["causal"]), q, k, v, mask, outs[0], given)
    if not isinstance(steps, str):
        return steps
    # q and k back in the run dtype, in scratch this node's steps keep; then the run dtype's attention
    held = ctx.shared_scratch(("sdpa_fp8_qk", "dequantized"), q.nbytes + k.nbytes)
    qd, kd = evolve(q, ptr=held.ptr, row=0, pitch=0), evolve(k, ptr=held.ptr + q.nbytes, row=0, pitch=0)
    back = [_fp8_dequantize(ctx, t8.ptr, s.ptr, t, t.shape[-2] * t.shape[-1], t.shape[-2] * t.shape[-1])
            for t8, s, t in ((q8, qs, qd), (k8, ks, kd))]  # fmt: skip
    back[0].scratch = held
    attention = _sdpa(ctx, node, attrs, [qd, kd, v, *ins[5:]], outs)
    ctx.choices[node.id] = f"{ctx.choices.get(node.id, 'sdpa')} in {v.dtype.value}, not fp8: {steps}"
    return [*back, *attention]


def _fp8_attention_problem(
    ctx: LowerCtx, q: DevTensor, k: DevTensor, v: DevTensor, mask: DevTensor | None, causal: bool
) -> str:
    """Why cuDNN's fp8 attention cannot run these operands on this device ("" when it may)."""
    d, dv, sq, skv = q.shape[3], v.shape[3], q.shape[1], k.shape[1]
    if d != dv or d % 16 or d > 256:
        return f"head dims q/k {d}, v {dv} (cuDNN's fp8 attention: equal, a multiple of 16, at most 256)"
    if causal and (sq != skv or mask is not None):
        return "causal with Sq != Skv or with a key mask"
    if int(ctx.backend.props["major"]) * 10 + int(ctx.backend.props["minor"]) < 89:
        return "no fp8 matrix units (sm_89+)"
    if ctx.backend.cudnn() is None:
        return f"cuDNN unavailable: {ctx.backend._cudnn_error}"
    return ""


def _cudnn_fp8_steps(
    ctx: LowerCtx, node: Node, scale: float, causal: bool, q: DevTensor, k: DevTensor, v: DevTensor,
    mask: DevTensor | None, o: DevTensor, given: QuantizedQK | None = None,
) -> Steps | str:  # fmt: skip
    """The steps of `_sdpa_fp8` on cuDNN (with `given`, `_sdpa_fp8_qk`'s), or why cuDNN refused the graph."""
    from dif_backend_cuda.sdpa import FP8_SCALES, CudnnSdpaFp8

    dt = v.dtype.value
    b, sq, hq, d = q.shape
    skv, hkv = k.shape[1], k.shape[2]
    strides = [row_stride(node, t, 2) for t in (q, k, v, o)]
    rows = (b * sq, b * skv, b * skv)
    widths = (hq * d, hkv * d, hkv * d)
    sizes = [r * w for r, w in zip(rows, widths, strict=True)]  # bytes of the e4m3 copies of q, k and v
    sizes[:2] = [0, 0] if given is not None else sizes[:2]  # q and k come quantized
    sizes += [rows[1] * widths[1], sizes[2]] if mask is not None else []  # k, v with the attended keys first
    parts = ctx.sm_count * FP8_BLOCKS
    scratch = ctx.shared_scratch(("sdpa_fp8",), sum(sizes) + rows[0] * widths[0] + 4 * (len(FP8_SCALES) + 3 * parts))
    q8, k8, v8, *gathered, o8 = np.cumsum([scratch.ptr, *sizes]).tolist()
    if given is not None:
        q8, k8 = given.q8.ptr, given.k8.ptr
    scales = o8 + rows[0] * widths[0]
    partial = scales + 4 * len(FP8_SCALES)
    lens, first = None, []
    if mask is not None:  # the e4m3 copies' rows (dense) with the attended keys first
        lens, first = _attended_keys_first(ctx, "f8e4m3", mask, sq, widths[1], k8, v8, widths[1], widths[2], *gathered)
    kv = gathered or [k8, v8]
    try:
        step = CudnnSdpaFp8(ctx.backend.cudnn(), b, sq, skv, hq, hkv, d, q8, *kv, o8, scales, scale, causal,
                            seq_lens=lens.ptr if lens is not None else 0)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the run dtype's attention runs it instead, saying why
        return f"cuDNN rejected it: {type(exc).__name__}: {str(exc)[:300]}"
    step.scratch = (scratch, lens)  # a larger node's scratch replaces the shared one: this step keeps its own
    views = [(q.ptr, rows[0], widths[0], strides[0]), (k.ptr, rows[1], widths[1], strides[1]),
             (v.ptr, rows[2], widths[2], strides[2])]  # fmt: skip
    t0 = 2 if given is not None else 0  # with q and k given, the passes cover v alone
    vec = _fp8_vec(views[t0:], v.dtype.itemsize)
    form = "_vec" if vec else ""
    args = [*(np.uint64(p) for p, *_ in views), *(i64(view[i]) for i in (1, 2, 3) for view in views), np.int32(t0)]
    grid = (parts, 3 - t0)
    given_scales = (given.q_scale.ptr, given.k_scale.ptr) if given is not None else (0, 0)
    amax = ctx.kernel("quant", f"fp8_amax3{form}_{dt}", grid, (THREADS,), [*args, np.uint64(partial)])
    quantize = ctx.kernel("quant", f"fp8_quantize3{form}_{dt}", grid, (THREADS,), [
        *args, np.uint64(partial), np.int32(parts), *map(np.uint64, (q8, k8, v8, scales, *given_scales))])  # fmt: skip
    dequantize = _fp8_dequantize(ctx, o8, scales + 4 * FP8_SCALES.index("descale_v"), o, widths[0], strides[3])
    how = "q and k quantized by their norms, v per tensor" if given is not None else "q/k/v quantized per tensor"
    how += "" if vec else " (one element a thread: a view's width, stride or alignment is not of 16 bytes)"
    if mask is None:
        ctx.choices[node.id] = f"cudnn-sdpa fp8-e4m3 ({step.choice}), {how}"
        return [amax, quantize, step, dequantize]
    order, gather = first
    zero_rows = _zero_masked_rows(ctx, dt, mask, o, sq, widths[0], strides[3], False)
    ctx.choices[node.id] = f"cudnn-sdpa fp8-e4m3 ({step.choice}), {how}, the attended keys gathered first"
    return [order, amax, quantize, gather, step, dequantize, zero_rows]


def _fp8_vec(views: list[tuple[int, int, int, int]], itemsize: int) -> bool:
    """The 16-byte form of the fp8 passes applies to these (pointer, rows, width, stride) views: widths and
    strides in whole groups of 8 values, 16-byte aligned bases, and 32-bit chunk indices."""
    return all(w % 8 == 0 and s % 8 == 0 and p % 16 == 0 and r * w // 8 < 2**31 and 8 * itemsize == 16
               for p, r, w, s in views)  # fmt: skip


def _fp8_dequantize(ctx: LowerCtx, src: int, scale: int, o: DevTensor, width: int, stride: int) -> Launch:
    """o (rows of `width` values, `stride` apart) = the dense e4m3 values at `src` times the f32 at `scale`."""
    rows = o.numel // width
    vec = _fp8_vec([(o.ptr, rows, width, stride)], o.dtype.itemsize) and src % 8 == 0
    name = f"fp8_dequantize{'_vec' if vec else ''}_{o.dtype.value}"
    grid = (ctx.sm_count * FP8_BLOCKS,)
    return ctx.kernel("quant", name, grid, (THREADS,), [np.uint64(src), np.uint64(scale), ptr(o), i64(rows),
                      i64(width), i64(stride)])  # fmt: skip


@lowering("sdpa_backward")
def _sdpa_backward(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """cuDNN's flash-attention backward (sdpa.py `CudnnSdpaBackward`); the per-row statistics it needs live
    in scratch shared by every node (the steps run one at a time)."""
    from dif_backend_cuda.sdpa import CudnnSdpaBackward

    handle = _cudnn_for(ctx, node, ins[0].dtype)
    q, k = ins[0], ins[1]
    b, sq, hq, d = q.shape
    skv, hkv = k.shape[1], k.shape[2]
    given = ins[5] if len(ins) > 5 else None  # the forward's statistics (`sdpa_stats`)
    _contiguous_stats(node, given)
    tensors = dict(zip(("q", "k", "v", "o", "do", "dq", "dk", "dv"), (*ins[:5], *outs), strict=True))
    stats = ctx.shared_scratch(("sdpa_backward_stats",), b * hq * sq * 4) if given is None else None
    try:
        step = CudnnSdpaBackward(
            handle, q.dtype, b, sq, skv, hq, hkv, d, {n: t.ptr for n, t in tensors.items()},
            stats.ptr if stats is not None else given.ptr, attrs["scale"] or 1.0 / math.sqrt(d),  # type: ignore[union-attr]
            {n: row_stride(node, t, 2) for n, t in tensors.items()}, recompute_stats=given is None,
        )  # fmt: skip
    except Exception as exc:
        raise unsupported(node, f"cuDNN rejected it: {type(exc).__name__}: {str(exc)[:300]}") from exc
    step.scratch = stats  # a larger node's scratch replaces the shared one; this step keeps its own alive
    ctx.choices[node.id] = f"cudnn-sdpa-backward ({step.choice})"
    return [step]


@lowering("sdpa_stats")
def _sdpa_stats(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    """cuDNN's SDPA with its softmax statistics written out (`generate_stats`), for the backward."""
    from dif_backend_cuda.sdpa import CudnnSdpa

    handle = _cudnn_for(ctx, node, ins[0].dtype)
    (q, k, v), (o, lse) = ins, outs
    _contiguous_stats(node, lse)
    b, sq, hq, d = q.shape
    strides = [row_stride(node, t, 2) for t in (q, k, v, o)]
    try:
        step = CudnnSdpa(
            handle, q.dtype, b, sq, k.shape[1], hq, k.shape[2], d, q.ptr, k.ptr, v.ptr, o.ptr,
            attrs["scale"] or 1.0 / math.sqrt(d), False, strides, stats=lse.ptr,
        )  # fmt: skip
    except Exception as exc:
        raise unsupported(node, f"cuDNN rejected it: {type(exc).__name__}: {str(exc)[:300]}") from exc
    ctx.choices[node.id] = f"cudnn-sdpa with statistics ({step.choice})"
    return [step]


def _contiguous_stats(node: Node, stats: DevTensor | None) -> None:
    if stats is not None and stats.pitched:
        raise unsupported(node, "the attention statistics as a view inside a wider buffer")


def _cudnn_for(ctx: LowerCtx, node: Node, dtype: DType) -> Any:
    """The backend's cuDNN context for a node only cuDNN runs (half precision), else why not."""
    need(node, dtype, (DType.F16, DType.BF16))
    handle = ctx.backend.cudnn()
    if handle is None:
        raise unsupported(node, f"cuDNN unavailable: {ctx.backend._cudnn_error}")
    return handle


FLASH_TRIED_SCORES = 256 * 256
"""Scores per head (Sq * Skv) up to which the NVRTC flash kernel is also timed against cuDNN's SDPA (under
tuning; the store keeps the verdict): at CLIP's 77 causal tokens cuDNN's kernel is mostly fixed cost."""


def _faster_of_cudnn_and_flash(
    ctx: LowerCtx, node: Node, cudnn_steps: Steps, flash: Callable[[], Launch], problem: tuple[Any, ...]
) -> Steps:
    """`cudnn_steps` (one SDPA step), or the flash kernel when the tuning store says (or timing shows) it is
    faster for this problem."""
    choices = ctx.backend.cudnn().choices
    if choices is None:
        return cudnn_steps
    from dif_backend_cuda.tuning import choose_form

    def resolved_flash() -> Launch:
        launch = flash()
        launch.resolve(0)  # no metadata: runnable now, for timing
        return launch

    makers = [lambda: cudnn_steps[0], resolved_flash]
    index, step = choose_form(choices, ("sdpa-form", *problem), makers, ctx.backend.stream)
    if index == 0:
        return cudnn_steps
    ctx.choices[node.id] = "nvrtc-flash (faster than cuDNN at this size)"
    return [step]


def _flash(
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
) -> Launch:
    """The NVRTC flash-attention launch (kernels/attention.cu) for one sdpa node."""
    dt = q.dtype.value
    b, sq, hq, d = q.shape
    skv, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
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
    limit = int(ctx.backend.props["smem_optin"])
    if shared > limit:  # above 48 KiB the launch opts in when resolved (`Launch.resolve`)
        raise unsupported(node, f"head dims {d}/{dv} need {shared} B of shared memory (device: {limit})")
    return launch


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
    if handle is not None and mask is not None and not causal and not reason:
        steps = _cudnn_over_attended_keys(ctx, node, handle, q, k, v, mask, o, scale, strides)
        if steps is not None:
            return steps
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
            return [to_bias, step, _zero_masked_rows(ctx, dt, mask, o, sq, hq * dv, strides[3], causal)]
    if choice == "cudnn":
        raise unsupported(node, f"cuDNN SDPA requested but not possible: {reason}")
    ctx.choices[node.id] = f"nvrtc-flash ({reason})"
    return None


def _cudnn_over_attended_keys(
    ctx: LowerCtx,
    node: Node,
    handle: Any,
    q: DevTensor,
    k: DevTensor,
    v: DevTensor,
    mask: DevTensor,
    o: DevTensor,
    scale: float,
    strides: list[int],
) -> Steps | None:
    """A key mask without a score bias: each batch row's attended keys (and their values) gathered to the
    front of a scratch copy, then cuDNN's padding mask over the first seq_kv[b] keys, then the fully
    masked query rows zeroed (kernels/attention.cu). None when cuDNN refuses its padding mask here."""
    from dif_backend_cuda.sdpa import CudnnSdpa

    b, sq, hq, d = q.shape
    skv, hkv = k.shape[1], k.shape[2]
    if v.shape[3] != d:
        return None
    dt, item = q.dtype.value, q.dtype.itemsize
    rows = b * skv * hkv * d  # elements of the dense k copy (and of the v copy)
    kv = ctx.shared_scratch(("sdpa_attended_keys", dt), 2 * rows * item)
    lens, (to_order, gather) = _attended_keys_first(
        ctx, dt, mask, sq, hkv * d, k.ptr, v.ptr, strides[1], strides[2], kv.ptr, kv.ptr + rows * item
    )
    try:
        step = CudnnSdpa(
            handle, q.dtype, b, sq, skv, hq, hkv, d, q.ptr, kv.ptr, kv.ptr + rows * item, o.ptr, scale, False,
            [strides[0], hkv * d, hkv * d, strides[3]], seq_lens=lens.ptr,
        )  # fmt: skip
    except Exception:  # noqa: BLE001 - cuDNN's own words go with the bias path's choice, if that one fails too
        return None
    step.scratch = (lens, kv)
    ctx.choices[node.id] = f"cudnn-sdpa ({step.choice}, over the attended keys gathered first)"
    return [to_order, gather, step, _zero_masked_rows(ctx, dt, mask, o, sq, hq * d, strides[3], False)]


def _attended_keys_first(
    ctx: LowerCtx, dt: str, mask: DevTensor, sq: int, width: int, k: int, v: int, kt: int, vt: int, kp: int,
    vp: int,
) -> tuple[Any, Steps]:  # fmt: skip
    """(the int32 buffer of the lengths cuDNN's padding mask reads, the steps that fill it): `sdpa_key_order`
    (each batch row's order with its attended keys first, seq_q [B] and seq_kv [B]) and `sdpa_gather_keys_16b`
    (the rows of `width` elements of k and v, `kt` / `vt` apart, gathered in that order into dense kp, vp, in
    16-byte units; `sdpa_gather_keys_<dt>` where a row or stride is not a whole number of them). The
    buffer is seq_q, seq_kv, then the order [B, Skv], and owned by the caller's step; it holds the whole
    lengths until the first run computes them, so that a plan timed at prepare reads only keys that exist."""
    import cupy

    b, skv = mask.shape
    whole = np.array([sq] * b + [skv] * b, np.int32)
    lens = cupy.cuda.Memory(whole.nbytes + b * skv * 4)
    cupy.cuda.runtime.memcpy(lens.ptr, whole.ctypes.data, whole.nbytes, 1)  # 1: host to device
    seq_q, seq_kv, order = (np.uint64(lens.ptr + 4 * b * i) for i in range(3))
    pointers = [np.uint64(k), np.uint64(v), order, np.uint64(kp), np.uint64(vp)]
    item = DType(dt).itemsize
    w16, n16 = width * item // 16, b * skv * 2 * width * item // 16
    units = all(e * item % 16 == 0 for e in (width, kt, vt)) and all(a % 16 == 0 for a in (k, v, kp, vp))
    if units and n16 < 2**30:  # the kernel's 32-bit indices
        gather = ctx.flat("attention", "sdpa_gather_keys_16b", n16, [*pointers, np.int32(skv), np.int32(w16),
                          np.int32(w16), i64(kt * item // 16), i64(vt * item // 16), np.int32(n16)])  # fmt: skip
    else:
        n = b * skv * 2 * width
        gather = ctx.flat("attention", f"sdpa_gather_keys_{dt}", n, [*pointers, i64(skv), i64(width), i64(width),
                          i64(kt), i64(vt), i64(n)])  # fmt: skip
    order_step = ctx.kernel("attention", "sdpa_key_order", (b,), (THREADS,), [ptr(mask), order, seq_q, seq_kv,
                            i64(sq), i64(skv)])  # fmt: skip
    return lens, [order_step, gather]


def _zero_masked_rows(
    ctx: LowerCtx, dt: str, mask: DevTensor, o: DevTensor, sq: int, width: int, ot: int, causal: bool
) -> Launch:
    """The kernel that zeroes the output rows (`width` elements, `ot` apart) of queries whose keys are all
    masked: what a softmax over no key leaves undefined, the reference makes zero."""
    b, skv = mask.shape
    return ctx.kernel("attention", f"sdpa_zero_masked_rows_{dt}", (b,), (THREADS,), [
        ptr(mask), ptr(o), i64(sq), i64(skv), i64(width), i64(ot), np.int32(causal)])  # fmt: skip
