"""CUDA lowerings of `dif.ops.conv`: conv2d (cuDNN when eligible, else the NVRTC implicit GEMM of
`kernels/conv.cu`) and upsample_nearest (the x2 vector kernels of `kernels/layout.cu`, else a strided copy).
"""

from __future__ import annotations

from typing import Any

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
    args = [ptr(x), ptr(w), ptr(bias), ptr(y), *(i64(v) for v in geometry)]
    return [ctx.kernel("conv", f"conv2d_{dt}", grid, (256,), args)]


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
            halves = _halves_if_faster(handle, step, conv, w.shape[0], y.shape[0])
            if halves is not None:
                ctx.choices[node.id] = f"cudnn-conv (two halves of the output channels, {halves[0].choice})"
                return _Steps(halves)
            ctx.choices[node.id] = f"cudnn-conv ({step.choice})"
            return step
    ctx.choices[node.id] = f"nvrtc-implicit-gemm ({reason})"
    return None


SPLIT_MIN_OUTPUTS = 256
"""Output channels from which a convolution is also tried as two convolutions of half the output channels each.
cuDNN has no fast plan in this layout for some problems that have one at half the outputs: the SD VAE decoder's
256 -> 256 3x3 at 512^2 ran at 34 TFLOP/s on the H200 with its best plan, its 256 -> 128 sibling at 285."""


class _Steps:
    """Several library steps run as one (what the conv2d lowering returns before its bias add)."""

    kind = "cudnn"

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps

    def __call__(self, stream: Any) -> None:
        for step in self.steps:
            step(stream)


def _halves_if_faster(handle: Any, whole: Any, conv: Any, outputs: int, batch: int) -> list[Any] | None:
    """The two half-output convolutions when the tuning store says (or, tuning on, timing shows) they beat
    `whole`; None otherwise, and always where halves are not contiguous slices of the output (batch > 1)."""
    choices = handle.choices
    if choices is None or batch != 1 or outputs < SPLIT_MIN_OUTPUTS or outputs % 2:
        return None
    halves: list[Any] = []

    def measure() -> int:
        from dif_backend_cuda.tuning import fastest

        halves.extend([conv(outputs // 2), conv(outputs // 2, outputs // 2)])
        candidates = [whole, _Steps(halves)]
        return fastest(lambda i: candidates[i](handle.stream), 2, handle.stream)[0]

    index, _how = choices.choose(("conv-halves", *whole.key), 2, measure)
    if index == 0:
        return None
    return halves or [conv(outputs // 2), conv(outputs // 2, outputs // 2)]


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
