"""CUDA lowering of `dif.ops.optim` (adamw_update) onto `kernels/fused.cu`: one elementwise pass per
parameter."""

from __future__ import annotations

from dif.dtypes import DType
from dif.ir.program import Node
from dif_backend_cuda.lower.base import Attrs, LowerCtx, Steps, Ts, f32, i64, lowering, need, ptr


@lowering("adamw_update")
def _adamw_update(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    p, g, m, v, step_size, root_bc2, decay = ins
    need(node, p.dtype, (DType.F32,))
    b1, b2 = float(attrs["beta1"]), float(attrs["beta2"])
    hyper = [f32(b1), f32(1 - b1), f32(b2), f32(1 - b2), f32(attrs["eps"])]
    args = [*map(ptr, (p, g, m, v, step_size, root_bc2, decay, *outs)), i64(p.numel), *hyper]
    return [ctx.flat("fused", "adamw_update_f32", p.numel, args)]
