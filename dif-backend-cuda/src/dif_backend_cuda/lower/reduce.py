"""CUDA lowering of `dif.ops.reduce` (reduce_sum / mean / max over any axes) onto the reduction kernels
of `kernels/norm.cu`: one warp per output, or for a few long reductions two passes over fp32 partial results."""

from __future__ import annotations

import math

import numpy as np

from dif.ir.program import Node
from dif_backend_cuda.lower.base import (
    FLOATS,
    THREADS,
    Attrs,
    LowerCtx,
    Steps,
    Ts,
    collapse,
    contiguous_strides,
    f32,
    i64,
    lowering,
    need,
    ptr,
)


@lowering("reduce_sum", "reduce_mean", "reduce_max")
def _reduce(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    axes = {a % len(x.shape) for a in attrs["axes"]}
    xs = contiguous_strides(x.shape)
    kept = [i for i in range(len(x.shape)) if i not in axes]
    red = sorted(axes)
    kshape, (kstr,) = collapse([x.shape[i] for i in kept], [[xs[i] for i in kept]])
    rshape, (rstr,) = collapse([x.shape[i] for i in red], [[xs[i] for i in red]])
    n_red = math.prod(rshape)
    meta = ctx.meta([len(kshape), *kshape, *kstr, len(rshape), *rshape, *rstr])
    kind = "max" if node.op == "reduce_max" else "sum"
    divisor = float(n_red) if node.op == "reduce_mean" else 1.0
    warps = THREADS // 32
    parts = split_parts(y.numel, n_red, ctx.sm_count)
    if parts == 1:
        args = [ptr(x), ptr(y), meta, i64(y.numel), i64(n_red), f32(divisor)]
        return [ctx.kernel("norm", f"reduce_{kind}_{dt}", (-(-y.numel // warps),), (THREADS,), args)]
    partials = ctx.shared_scratch("reduce_partials", 4 * PARTIALS)
    first = [ptr(x), np.uint64(partials.ptr), meta, i64(y.numel), i64(n_red), i64(parts)]
    second = [np.uint64(partials.ptr), ptr(y), i64(y.numel), i64(parts), f32(divisor)]
    split = ctx.kernel("norm", f"reduce_partial_{kind}_{dt}", (-(-y.numel * parts // warps),), (THREADS,), first)
    split.scratch = partials  # the buffer lives as long as the steps that use it
    return [split, ctx.kernel("norm", f"reduce_finish_{kind}_{dt}", (-(-y.numel // warps),), (THREADS,), second)]


PARTIALS = 1 << 16  # fp32 partial results of a split reduction (one scratch buffer of fixed size for all)
WARP_SHARE = 2048  # elements a warp of a split reduction reduces at least
SPLIT_BELOW = 8  # outputs per SM under which a long reduction is split: fewer warps than would fill the SMs


def split_parts(n_out: int, n_red: int, sm_count: int) -> int:
    """Into how many ranges each output's `n_red` elements are split (kernels/norm.cu reduce_partial_*): 1
    when one warp per output already fills the device or the reductions are short."""
    if n_out >= SPLIT_BELOW * sm_count or n_red < 2 * WARP_SHARE:
        return 1
    return max(1, min(-(-n_red // WARP_SHARE), -(-32 * sm_count // n_out), PARTIALS // n_out))
