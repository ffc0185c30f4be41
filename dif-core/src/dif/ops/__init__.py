"""The DiffIR opset. Importing this package registers every core op in `OPS`."""

import dif.ops.norm_act  # noqa: F401  (registration: GroupNorm + SiLU, dif/ops/norm_act.py)
from dif.ops import attention, conv, elementwise, fused, layout, linalg, norm, optim, quant, reduce  # noqa: F401  (registration)
from dif.ops.registry import OPS, AttrSpec, Case, OpDef, OpTable, defop, get_op

__all__ = ["OPS", "AttrSpec", "Case", "OpDef", "OpTable", "defop", "get_op"]
