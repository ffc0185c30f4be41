"""CUDA lowering of `dif.ops.reduce` (reduce_sum / mean / max over any axes) onto the reduction kernels
of `kernels/norm.cu`."""

from __future__ import annotations

import math

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
    args = [ptr(x), ptr(y), meta, i64(y.numel), i64(n_red), f32(divisor)]
    return [ctx.kernel("norm", f"reduce_{kind}_{dt}", (-(-y.numel // warps),), (THREADS,), args)]
