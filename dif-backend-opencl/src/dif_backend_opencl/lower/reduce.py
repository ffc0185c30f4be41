"""OpenCL lowering of `dif.ops.reduce` (reduce_sum / mean / max over any axes) onto the `reduce` row
kernel of `kernels/norm.cl`."""

from __future__ import annotations

import numpy as np

from dif.ir.program import Node
from dif_backend_opencl.lower.base import (
    Attrs,
    LowerCtx,
    Refs,
    Steps,
    collapse,
    contiguous_strides,
    lowers,
    numel,
    vec8,
)


@lowers("reduce_sum", "reduce_mean", "reduce_max")
def lower_reduce(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x,), (y,) = ins, outs
    shape = x.type.shape
    axes = {a % len(shape) for a in attrs["axes"]}
    st = contiguous_strides(shape)
    kept = [i for i in range(len(shape)) if i not in axes]
    red = [i for i in range(len(shape)) if i in axes]
    kshape, (kst,) = collapse([shape[i] for i in kept], [[st[i] for i in kept]])
    rshape, (rst,) = collapse([shape[i] for i in red], [[st[i] for i in red]])
    mode = {"reduce_sum": 0, "reduce_mean": 1, "reduce_max": 2}[node.op]
    count = numel(rshape)
    args = (*y.full(), *x.full(), vec8(kshape, 1), vec8(kst, 0), vec8(rshape, 1), vec8(rst, 0),
            np.int64(count), np.int32(mode))  # fmt: skip
    return ctx.launch_rows("norm", "reduce", y.numel, *args)
