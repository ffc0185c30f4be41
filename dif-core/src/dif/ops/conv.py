"""Convolution and resampling on NCHW images."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from dif.dtypes import DType
from dif.ir.types import TensorType
from dif.ops._rules import fail, float_cases, fp, need_float, need_rank, need_same_dtype
from dif.ops.registry import AttrSpec, Case, defop


def _conv_out(size: int, pad: int, k: int, stride: int, dil: int) -> int:
    return (size + pad - dil * (k - 1) - 1) // stride + 1


def _conv2d_infer(
    x: TensorType,
    w: TensorType,
    b: TensorType | None = None,
    *,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> TensorType:
    need_float(x)
    need_same_dtype(*(t for t in (x, w, b) if t is not None))
    need_rank(x, 4, what="x [N, C, H, W]")
    need_rank(w, 4, what="w [O, C/groups, kh, kw]")
    if len(stride) != 2 or len(dilation) != 2 or len(padding) != 4:
        raise fail("stride and dilation take 2 values, padding 4 (top, bottom, left, right)")
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise fail(f"bad stride {stride}, dilation {dilation} or padding {padding}")
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if groups < 1 or c % groups or o % groups or cg != c // groups:
        raise fail(f"weight {w} does not fit {c} input channels in {groups} groups")
    if b is not None and b.shape != (o,):
        raise fail(f"bias must be [{o}], got {b}")
    ho = _conv_out(h, padding[0] + padding[1], kh, stride[0], dilation[0])
    wo = _conv_out(wd, padding[2] + padding[3], kw, stride[1], dilation[1])
    if ho < 1 or wo < 1:
        raise fail(f"kernel {kh}x{kw} does not fit the padded {h}x{wd} input")
    return TensorType((n, o, ho, wo), x.dtype)


def _conv2d_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    three = float_cases(rng, dtype, [[(2, 4, 7, 6), (5, 4, 3, 3), (5,)]], padding=(1, 1, 1, 1))
    one = float_cases(rng, dtype, [[(1, 6, 5, 5), (3, 6, 1, 1)]])
    down = float_cases(rng, dtype, [[(1, 3, 8, 8), (4, 3, 3, 3), (4,)]], stride=(2, 2), padding=(0, 1, 0, 1))
    grouped = float_cases(rng, dtype, [[(1, 4, 6, 6), (4, 2, 3, 3)]], groups=2, dilation=(2, 1), padding=(2, 2, 1, 1))
    return three + one + down + grouped


@defop(
    "conv2d",
    operands=("x", "w", "b?"),
    attrs=(
        AttrSpec("stride", "ints", (1, 1)),
        AttrSpec("padding", "ints", (0, 0, 0, 0), doc="zero padding (top, bottom, left, right)"),
        AttrSpec("dilation", "ints", (1, 1)),
        AttrSpec("groups", "int", 1),
    ),
    infer=_conv2d_infer,
    cases=_conv2d_cases,
    category="conv",
)
def conv2d(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> np.ndarray:
    """conv2d(x[N,C,H,W], w[O,C/groups,kh,kw], b?[O]; stride, padding, dilation, groups) -> [N,O,Ho,Wo].

    Cross-correlation as in torch, zero padding given per side (asymmetric padding covers the
    'pad right/bottom then stride 2' downsamplers), fp32 accumulation."""
    xf = np.pad(fp(x), ((0, 0), (0, 0), (padding[0], padding[1]), (padding[2], padding[3])))
    wf = fp(w)
    o, cg, kh, kw = w.shape
    span = (dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1)
    win = sliding_window_view(xf, span, axis=(2, 3))[:, :, :: stride[0], :: stride[1], :: dilation[0], :: dilation[1]]
    og = o // groups
    outs = [
        np.einsum("nchwij,ocij->nohw", win[:, g * cg : (g + 1) * cg], wf[g * og : (g + 1) * og], optimize=True)
        for g in range(groups)
    ]
    y = np.concatenate(outs, axis=1) if groups > 1 else outs[0]
    if b is not None:
        y = y + fp(b)[None, :, None, None]
    return y


def _up_infer(x: TensorType, *, scale: int) -> TensorType:
    need_rank(x, 4, what="x [N, C, H, W]")
    if scale < 1:
        raise fail(f"scale must be >= 1, got {scale}")
    n, c, h, w = x.shape
    return TensorType((n, c, h * scale, w * scale), x.dtype)


@defop(
    "upsample_nearest",
    operands=("x",),
    attrs=(AttrSpec("scale", "int", 2),),
    infer=_up_infer,
    cases=lambda rng, dt: float_cases(rng, dt, [[(2, 3, 4, 5)]]) + float_cases(rng, dt, [[(1, 2, 3, 3)]], scale=3),
    category="conv",
)
def upsample_nearest(x: np.ndarray, *, scale: int) -> np.ndarray:
    """upsample_nearest(x[N,C,H,W]; scale) -> [N,C,H*scale,W*scale]: each pixel repeated scale x scale times."""
    return np.repeat(np.repeat(x, scale, axis=2), scale, axis=3)
