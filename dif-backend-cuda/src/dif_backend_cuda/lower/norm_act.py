"""CUDA lowering of `dif.ops.norm_act`: group_norm_silu runs group_norm's kernels in their SiLU variants
(`kernels/norm.cu` group_norm_silu_* / group_norm_silu_apply_*: the same statistics, the normalized value
rounded to the storage dtype as the unfused pair stores it, then silu), so each resnet's GN + SiLU writes
its activation once. Same launch shapes as group_norm (`lower.norm.group_norm_steps`)."""

from __future__ import annotations

from dif.ir.program import Node
from dif_backend_cuda.lower.base import Attrs, LowerCtx, Steps, Ts, lowering
from dif_backend_cuda.lower.norm import group_norm_steps


@lowering("group_norm_silu")
def _group_silu(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    return group_norm_steps(ctx, node, attrs, ins, outs, "group_norm_silu")
