"""OpenCL lowering of `dif.ops.norm_act`: group_norm_silu is group_norm's three launches (partial
moments, merge, apply) with the SiLU applied in the apply kernel (`kernels/norm.cl` gn_apply, silu=1),
so the normalized activation is written once instead of written, read and written again.
In f16 / bf16 the SiLU acts on the fp32 normalized value (the reference rounds it first): within the
conformance tolerance of those dtypes."""

from __future__ import annotations

from dif.ir.program import Node
from dif_backend_opencl.lower.base import Attrs, LowerCtx, Refs, Steps, lowers
from dif_backend_opencl.lower.norm import group_norm


@lowers("group_norm_silu")
def lower_group_norm_silu(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Refs, outs: Refs) -> Steps:
    (x, w, b), (y,) = ins, outs
    return group_norm(ctx, y, x, w, b, int(attrs["groups"]), float(attrs["eps"]), silu=True)
