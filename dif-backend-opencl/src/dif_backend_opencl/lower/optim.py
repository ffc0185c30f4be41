"""OpenCL lowering of `dif.ops.optim` (adamw_update) onto `kernels/fused.cl`: one pass per parameter."""

from __future__ import annotations

import numpy as np

from dif.ir.program import Node
from dif_backend_opencl.lower.base import Attrs, LowerCtx, Refs, Steps, lowers


@lowers("adamw_update")
def lower_adamw_update(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    b1, b2 = float(attrs["beta1"]), float(attrs["beta2"])
    hyper = (np.float32(b1), np.float32(1 - b1), np.float32(b2), np.float32(1 - b2), np.float32(attrs["eps"]))
    n = ins[0].numel
    refs = [a for r in (*outs, *ins) for a in r.full()]
    return ctx.launch_1d("fused", "adamw_update", n, *refs, np.int64(n), *hyper)
