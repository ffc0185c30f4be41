"""CUDA lowerings of `dif.ops.conv`: conv2d (cuDNN when eligible, else the NVRTC implicit GEMM of
`kernels/conv.cu`) and upsample_nearest (the x2 vector kernels of `kernels/layout.cu`, else a strided copy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dif.ir.program import Node
from dif_backend_cuda.lower.base import (
    FLOATS,
    MAX_GRID_Z,
    TILE,
    Attrs,
    DevTensor,
    LowerCtx,
    Steps,
    Ts,
    aligned,
    bits,
    broadcast_strides,
    contiguous_strides,
    i64,
    lowering,
    need,
    ptr,
    strided_meta,
    unsupported,
)
from dif_backend_cuda.lower.layout import copy_steps


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
    reduction = (c // groups) * kh * kw
    splits, chunk = split_k(grid[0] * grid[1] * groups, reduction, o * n * ho * wo, groups, ctx.sm_count)
    if splits == 1:
        args = [ptr(x), ptr(w), ptr(bias), ptr(y), *(i64(v) for v in geometry)]
        return [ctx.kernel("conv", f"conv2d_{dt}", grid, (256,), args)]
    ctx.choices[node.id] += f", split over K in {splits}"
    part = ctx.shared_scratch("conv_partials", 4 * splits * o * n * ho * wo)
    first = [ptr(x), ptr(w), np.uint64(part.ptr), *(i64(v) for v in geometry), i64(chunk)]
    split = ctx.kernel("conv", f"conv2d_split_{dt}", (grid[0], grid[1], groups * splits), (256,), first)
    split.scratch = part  # the buffer lives as long as the steps that use it
    second = [np.uint64(part.ptr), ptr(bias), ptr(y), i64(o), i64(n * ho * wo), i64(ho * wo), i64(splits)]
    return [split, ctx.flat("conv", f"conv2d_finish_{dt}", o * n * ho * wo, second)]


SPLIT_K_SHARE = 1024
"""Reduction terms a block of a split-K convolution sums at least (64 of gemm_tile's k-steps of 16)."""
SPLIT_K_MAX_BYTES = 64 << 20
"""Most fp32 partial-sum bytes a split-K convolution may hold (one scratch buffer shared by the program)."""


def split_k(tiles: int, reduction: int, outputs: int, groups: int, sm_count: int) -> tuple[int, int]:
    """(splits, terms per split) of the implicit GEMM's reduction: (1, reduction) when its `tiles` output tiles
    already fill the SMs or the reduction is short; else enough splits for ~2 blocks per SM, each summing at least
    SPLIT_K_SHARE terms (a multiple of gemm_tile's k-step), within the partials' and the grid's bounds."""
    if tiles >= sm_count or reduction < 4 * SPLIT_K_SHARE:
        return 1, reduction
    want = min(-(-2 * sm_count // tiles), reduction // SPLIT_K_SHARE, MAX_GRID_Z // groups)
    want = min(want, SPLIT_K_MAX_BYTES // (4 * outputs))
    if want <= 1:
        return 1, reduction
    chunk = -(-reduction // want)
    chunk = -(-chunk // 16) * 16
    return -(-reduction // chunk), chunk


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

        def conv(outputs: int, first: int = 0) -> Any:  # output channels [first, first + outputs) of the node
            w_at, y_at = first * w.numel // w.shape[0], first * y.numel // y.shape[1]
            return CudnnConv(
                handle, x.dtype, x.shape, (outputs, *w.shape[1:]), (y.shape[0], outputs, *y.shape[2:]), x.ptr,
                w.ptr + w_at * w.dtype.itemsize, y.ptr + y_at * y.dtype.itemsize, (pt, pl), attrs["stride"],
                attrs["dilation"],
            )  # fmt: skip

        try:
            step = conv(w.shape[0])
        except Exception as exc:
            reason = f"cuDNN rejected it: {type(exc).__name__}: {str(exc)[:200]}"
        else:
            form, chosen = _fastest_form(ctx, handle, step, conv, x, w, y, attrs)
            ctx.choices[node.id] = form
            return chosen
    ctx.choices[node.id] = f"nvrtc-implicit-gemm ({reason})"
    return None


SPLIT_MIN_OUTPUTS = 256
"""Output channels from which a convolution is also tried as two convolutions of half the output channels each.
cuDNN has no fast plan in this layout for some problems that have one at half the outputs: the SD VAE decoder's
256 -> 256 3x3 at 512^2 ran at 34 TFLOP/s on the H200 with its best plan, its 256 -> 128 sibling at 285."""

GEMM_MAX_PIXELS = 1024
"""Output pixels up to which a convolution is also tried as one cuBLASLt GEMM (after an im2col unless it is a
1x1 convolution). At a UNet's 8^2 and 16^2 levels the problem is a skinny GEMM (64 output pixels, K = 1280 * 9)
that cuBLASLt splits over K; cuDNN's best plan ran SD's 1280 -> 1280 3x3 at 8^2 in ~55 us on the H200."""


class _Steps:
    """Several library steps run as one (what the conv2d lowering returns before its bias add)."""

    kind = "cudnn"

    def __init__(self, steps: list[Any], scratch: Any = None) -> None:
        self.steps, self.scratch = steps, scratch  # scratch: device memory the steps use, kept alive with them

    def __call__(self, stream: Any) -> None:
        for step in self.steps:
            step(stream)


def _fastest_form(
    ctx: LowerCtx, handle: Any, whole: Any, conv: Any, x: DevTensor, w: DevTensor, y: DevTensor, attrs: Attrs
) -> tuple[str, Any]:
    """(how it runs, the step) for one convolution: cuDNN's whole convolution, or where they apply and the
    tuning store says (or, tuning on, timing shows) they are faster, two half-output cuDNN convolutions or
    one cuBLASLt GEMM. Only one image: halves and the GEMM's output are contiguous slices of it then."""
    outputs, batch = w.shape[0], y.shape[0]
    forms: dict[str, Any] = {f"cudnn-conv ({whole.choice})": lambda: whole}
    if batch == 1 and outputs >= SPLIT_MIN_OUTPUTS and outputs % 2 == 0:

        def halves() -> Any:
            return _Steps([conv(outputs // 2), conv(outputs // 2, outputs // 2)])

        forms["cudnn-conv (two halves of the output channels)"] = halves
    lt = ctx.backend.lt() if batch == 1 and attrs["groups"] == 1 else None
    if lt is not None and y.shape[2] * y.shape[3] <= GEMM_MAX_PIXELS:
        forms["cublaslt-conv (im2col + GEMM)"] = lambda: _gemm_form(ctx, lt, x, w, y, attrs)
    if handle.choices is None or len(forms) == 1:
        return next(iter(forms)), whole
    from dif_backend_cuda.tuning import choose_form

    names = list(forms)
    index, step = choose_form(handle.choices, ("conv-form", *whole.key, *names), list(forms.values()), handle.stream)
    return names[index], step


def _gemm_form(ctx: LowerCtx, lt: Any, x: DevTensor, w: DevTensor, y: DevTensor, attrs: Attrs) -> _Steps:
    """y[O, P] = w[O, K] @ col[P, K]^T for one image (P = Ho * Wo, K = C * kh * kw), column-major as cuBLASLt
    sees it: D[P, O] = col^T[P, K] @ w^T[K, O]. col is the im2col patch matrix in scratch memory, or x itself
    for a 1x1 convolution without stride, padding or dilation ([C, P] row-major is [P, C] column-major)."""
    import cupy

    from dif_backend_cuda.gemm import OP_N, OP_T, GemmProblem, LtMatmul

    _n, c, h, wd = x.shape
    o, _c, kh, kw = w.shape
    ho, wo = y.shape[2], y.shape[3]
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
    pixels, k = ho * wo, c * kh * kw
    direct = (kh, kw, sh, sw, dh, dw) == (1, 1, 1, 1, 1, 1) and not any((pt, pb, pl, pr))
    steps: list[Any] = []
    scratch = None
    if direct:
        a, lda, trans_a = x.ptr, pixels, OP_N
    else:
        scratch = cupy.cuda.Memory(pixels * k * x.dtype.itemsize)
        total = pixels * k
        blocks = max(1, min(-(-total // 256), ctx.sm_count * 16))
        geometry = (c, h, wd, kh, kw, ho, wo, sh, sw, pt, pl, dh, dw)
        launch = ctx.kernel("conv", f"im2col_{x.dtype.value}", (blocks,), (256,), [
            ptr(x), np.uint64(scratch.ptr), *(i64(v) for v in geometry)])  # fmt: skip
        launch.resolve(0)  # no metadata; timed at prepare before the program's own resolve
        steps.append(launch)
        a, lda, trans_a = scratch.ptr, k, OP_T
    problem = GemmProblem(x.dtype, m=pixels, n=o, k=k, a=a, lda=lda, trans_a=trans_a, b=w.ptr, ldb=k,
                          trans_b=OP_N, d=y.ptr, ldd=pixels)  # fmt: skip
    gemm = LtMatmul(lt, problem)
    gemm.tune(ctx.backend.stream)
    steps.append(gemm)
    return _Steps(steps, scratch)


@lowering("upsample_nearest")
def _upsample(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    n, c, h, w = x.shape
    s = attrs["scale"]
    width = bits(y)
    if s == 2 and w % 4 == 0 and width in (16, 32) and aligned(4, x, y):
        rows = n * c * h
        return [ctx.flat("layout", f"upsample2x_u{width}", rows * w // 4, [ptr(x), ptr(y), i64(rows), i64(w)])]
    shape = (n, c, h, s, w, s)
    return copy_steps(ctx, x.ptr, y.ptr, shape, [c * h * w, h * w, w, 0, 1, 0], contiguous_strides(shape), bits(y))
