"""The one attribution vocabulary of dif traces: what kind of work an event is (used by every backend's
executor when it records, and by `dif trace` when it attributes time).

An op event's kind comes from its generic op name (GEMMs, attention, convolutions) or else from the
op table's category; runtime events (copies, staging, waits, syncs, allocations) name their kind.
"""

from __future__ import annotations

GEMM = "gemm"
ATTENTION = "attention"
CONVOLUTION = "convolution"
ELEMENTWISE = "elementwise"
NORM = "norm"
LAYOUT = "layout"
REDUCTION = "reduction"
FUSED = "fused"
OTHER = "other"
COPY_H2D = "copy.h2d"
COPY_D2H = "copy.d2h"
COPY_D2D = "copy.d2d"
STAGING = "staging"
WAIT = "wait"
SYNC = "sync"
ALLOC = "alloc"

OP_KINDS = (GEMM, ATTENTION, CONVOLUTION, ELEMENTWISE, NORM, LAYOUT, REDUCTION, FUSED, OTHER)
RUNTIME_KINDS = (COPY_H2D, COPY_D2H, COPY_D2D, STAGING, WAIT, SYNC, ALLOC)
KINDS = OP_KINDS + RUNTIME_KINDS

_BY_OP = {
    "linear": GEMM,
    "linear_add": GEMM,  # a GEMM with the residual added in its epilogue (fuse_linear_residual)
    "matmul": GEMM,
    "sdpa": ATTENTION,
    "conv2d": CONVOLUTION,
    "conv3d": CONVOLUTION,
}
_BY_CATEGORY = {
    "linalg": GEMM,
    "attention": ATTENTION,
    "conv": CONVOLUTION,
    "elementwise": ELEMENTWISE,
    "norm": NORM,
    "layout": LAYOUT,
    "reduce": REDUCTION,
    "fused": FUSED,
}


def op_kind(op: str) -> str:
    """The attribution kind of a DiffIR op: `linear` -> "gemm", `rms_norm` -> "norm", an op the table
    does not know -> "other"."""
    if op in _BY_OP:
        return _BY_OP[op]
    from dif.ops.registry import OPS

    if op not in OPS:
        return OTHER
    return _BY_CATEGORY.get(OPS.get(op).category, OTHER)
