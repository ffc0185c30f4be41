"""VJPs of `dif.ops.linalg`: linear (torch layout) and batched matmul."""

from __future__ import annotations

import math

from dif.autodiff.emit import sum_to, transpose_last2
from dif.autodiff.registry import VjpArgs, vjp
from dif.ir.builder import Var


@vjp("linear")
def _linear(a: VjpArgs) -> list[Var | None]:
    """y = x w^T + bias: dx = g w, dw = g^T x (leading axes flattened), dbias = sum g."""
    b = a.b
    x, w = a.operands[0], a.operands[1]
    assert x is not None and w is not None
    g = a.g
    out: list[Var | None] = [None, None, None]
    if a.wants[0]:
        out[0] = b.emit("linear", g, b.emit("transpose", w, perm=(1, 0)))
    rows = math.prod(x.shape[:-1])
    if a.wants[1]:
        g2 = b.emit("reshape", g, shape=(rows, g.shape[-1]))
        x2 = b.emit("reshape", x, shape=(rows, x.shape[-1]))
        out[1] = b.emit("matmul", b.emit("transpose", g2, perm=(1, 0)), x2)
    if len(a.operands) > 2 and a.operands[2] is not None and a.wants[2]:
        out[2] = b.emit("reduce_sum", g, axes=tuple(range(g.type.rank - 1))) if g.type.rank > 1 else g
    return out[: len(a.operands)]


@vjp("matmul")
def _matmul(a: VjpArgs) -> list[Var | None]:
    """y = a @ b: da = g b^T, db = a^T g, each summed back over broadcast batch axes."""
    bld = a.b
    xa, xb = a.operands
    assert xa is not None and xb is not None
    ga = sum_to(bld, bld.emit("matmul", a.g, transpose_last2(bld, xb)), xa.shape) if a.wants[0] else None
    gb = sum_to(bld, bld.emit("matmul", transpose_last2(bld, xa), a.g), xb.shape) if a.wants[1] else None
    return [ga, gb]
