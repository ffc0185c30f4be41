"""OpenCL lowering (backend side of the pipeline, after planning): each DiffIR node becomes a few
pre-bound kernel launches (prepare time, before `run`).

`base` holds the shared types and the backend's `LoweringTable`; one module per `dif.ops` module holds
the lowerings of that module's ops. Importing this package imports them in order (that fills the table);
nothing here imports pyopencl. An op or dtype without a lowering raises `NotImplementedOnBackend`.
"""

from __future__ import annotations

from dif.errors import NotImplementedOnBackend
from dif.ir.program import Node
from dif_backend_opencl.lower import (  # noqa: F401
    attention,
    conv,
    elementwise,
    fused,
    layout,
    linalg,
    norm,
    norm_act,
    optim,
    quant,
    reduce,
)
from dif_backend_opencl.lower.base import (
    BACKEND,
    DT_CODE,
    LOWERINGS,
    Copy,
    Launch,
    LowerCtx,
    LowerOptions,
    Ref,
    Slot,
    Step,
    Steps,
    Upload,
    broadcast_strides,
    collapse,
    contiguous_strides,
    vec8,
)

__all__ = [
    "LOWERINGS",
    "Copy",
    "Launch",
    "LowerCtx",
    "LowerOptions",
    "Ref",
    "Slot",
    "Step",
    "Upload",
    "broadcast_strides",
    "collapse",
    "contiguous_strides",
    "lower_node",
    "vec8",
]


def lower_node(ctx: LowerCtx, node: Node, ins: list[Ref], outs: list[Ref]) -> Steps:
    """The steps of one node (the executor appends them); `NotImplementedOnBackend` names op and node
    when there is no lowering or an operand's dtype has no OpenCL storage."""
    fn = LOWERINGS.lookup(node)
    for r in (*ins, *outs):
        if r.dtype not in DT_CODE:
            raise NotImplementedOnBackend(node.op, BACKEND, f"node {node.id}: dtype {r.dtype.value} is not supported")
    ctx.begin(node.id)
    return fn(ctx, node, dict(node.attrs), ins, outs)
