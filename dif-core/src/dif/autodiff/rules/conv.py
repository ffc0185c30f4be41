"""VJPs of `dif.ops.conv`, both conv2d gradients written as conv2d again.

dx is the transposed convolution: the output gradient with stride-1 zeros between rows/columns,
convolved (fully padded, same dilation) with the kernel flipped and its in/out channels swapped.
dw correlates the input with the output gradient: batch and channels trade places so conv2d sums over
the batch, with stride and dilation exchanged.
"""

from __future__ import annotations

from dif.autodiff.emit import flip, interleave_zeros, pad_axis
from dif.autodiff.registry import VjpArgs, vjp
from dif.ir.builder import ProgramBuilder, Var

_SWAP01 = (1, 0, 2, 3)


def _grad_input(b: ProgramBuilder, g: Var, x: Var, w: Var, attrs: dict) -> Var:  # type: ignore[type-arg]
    o, cg, kh, kw = w.shape
    groups = int(attrs["groups"])
    (s0, s1), (d0, d1), (pt, _, pl, _) = attrs["stride"], attrs["dilation"], attrs["padding"]
    og = o // groups
    wt = b.emit("reshape", w, shape=(groups, og, cg, kh, kw))
    wt = b.emit("reshape", b.emit("transpose", wt, perm=(0, 2, 1, 3, 4)), shape=(groups * cg, og, kh, kw))
    wt = flip(b, flip(b, wt, 2), 3)
    spread = interleave_zeros(b, interleave_zeros(b, g, 2, s0), 3, s1)
    full = b.emit(
        "conv2d", spread, wt,
        padding=(d0 * (kh - 1), d0 * (kh - 1), d1 * (kw - 1), d1 * (kw - 1)), dilation=(d0, d1), groups=groups,
    )  # fmt: skip
    # `full` covers padded-input rows 0 .. len-1; keep rows pt .. pt+H-1 (zeros past its end)
    h, wd = x.shape[2], x.shape[3]
    out = pad_axis(b, full, 2, -pt, pt + h - full.shape[2])
    return pad_axis(b, out, 3, -pl, pl + wd - full.shape[3])


def _grad_weight(b: ProgramBuilder, g: Var, x: Var, w: Var, attrs: dict) -> Var:  # type: ignore[type-arg]
    o, cg, kh, kw = w.shape
    groups = int(attrs["groups"])
    og = o // groups
    xt = b.emit("transpose", x, perm=_SWAP01)  # [C, N, H, W]: the batch becomes the summed channel axis
    gt = b.emit("transpose", g, perm=_SWAP01)  # [O, N, Ho, Wo]: the output gradient is the kernel
    parts = []
    for gi in range(groups):
        xg = xt if groups == 1 else b.emit("slice", xt, axis=0, start=gi * cg, stop=(gi + 1) * cg)
        gg = gt if groups == 1 else b.emit("slice", gt, axis=0, start=gi * og, stop=(gi + 1) * og)
        r = b.emit("conv2d", xg, gg, padding=attrs["padding"], stride=attrs["dilation"], dilation=attrs["stride"])
        if r.shape[2] != kh:
            r = b.emit("slice", r, axis=2, start=0, stop=kh)
        if r.shape[3] != kw:
            r = b.emit("slice", r, axis=3, start=0, stop=kw)
        parts.append(b.emit("transpose", r, perm=_SWAP01))
    return parts[0] if groups == 1 else b.emit("concat", *parts, axis=0)


@vjp("conv2d")
def _conv2d(a: VjpArgs) -> list[Var | None]:
    b, x, w = a.b, a.x, a.operands[1]
    assert w is not None
    attrs = dict(a.attrs)
    out: list[Var | None] = [None] * len(a.operands)
    if a.wants[0]:
        out[0] = _grad_input(b, a.g, x, w, attrs)
    if a.wants[1]:
        out[1] = _grad_weight(b, a.g, x, w, attrs)
    if len(a.operands) > 2 and a.wants[2]:
        out[2] = b.emit("reduce_sum", a.g, axes=(0, 2, 3))
    return out


@vjp("upsample_nearest")
def _upsample(a: VjpArgs) -> list[Var | None]:
    b, x, s = a.b, a.x, int(a.attrs["scale"])
    n, c, h, w = x.shape
    blocks = b.emit("reshape", a.g, shape=(n, c, h, s, w, s))
    return [b.emit("reduce_sum", blocks, axes=(3, 5))]
