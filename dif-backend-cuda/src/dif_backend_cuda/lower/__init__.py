"""CUDA lowering (backend side of the pipeline, after planning): one DiffIR node -> the device steps that
compute it over fixed addresses (arena slots, weights, input slots): NVRTC kernel launches, device
copies and library calls.

`base` holds the shared types and the backend's `LoweringTable`; one module per `dif.ops` module holds
the lowerings of that module's ops. Importing this package imports them in order (that fills the table);
nothing here imports cupy. An op or dtype without a lowering raises `NotImplementedOnBackend`.
"""

from __future__ import annotations

from dif.ir.program import Node
from dif_backend_cuda.lower import (  # noqa: F401
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
from dif_backend_cuda.lower.base import (
    IN_PLACE,
    LOWERINGS,
    PITCHED_ROWS,
    Copy,
    DevTensor,
    Launch,
    LowerCtx,
    MetaRef,
    Steps,
    arena_tensor,
    broadcast_strides,
    collapse,
    contiguous_strides,
    strided_meta,
    unsupported,
)

__all__ = [
    "LOWERINGS",
    "PITCHED_ROWS",
    "Copy",
    "DevTensor",
    "Launch",
    "LowerCtx",
    "MetaRef",
    "arena_tensor",
    "broadcast_strides",
    "collapse",
    "contiguous_strides",
    "lower_node",
    "strided_meta",
]


def lower_node(ctx: LowerCtx, node: Node, ins: list[DevTensor], outs: list[DevTensor]) -> Steps:
    """The steps computing `node` from `ins` into `outs` (results skipped when empty)."""
    fn = LOWERINGS.lookup(node)
    if node.op not in (*PITCHED_ROWS, *IN_PLACE) and any(t.pitched for t in (*ins, *outs)):
        raise unsupported(node, "an operand or result is a pitched view, which this lowering does not address")
    if all(o.numel == 0 for o in outs):
        return []
    attrs = ctx.table.get(node.op).check_attrs(node.attrs)
    return fn(ctx, node, attrs, ins, outs)
