"""VJPs of `dif.ops.linalg`: linear (torch layout) and batched matmul."""

from __future__ import annotations

import math

from dif.autodiff.emit import sum_to, transpose_last2
from dif.autodiff.registry import VjpArgs, vjp
from dif.ir.builder import Var


@vjp("linear")
def _linear(a: VjpArgs) -> list[Var | None]:
    """y = x w^T + bias: dx = g w, dw = g^T x (leading axes flattened), dbias = sum g.

    Nothing as large as a weight is transposed per step: dx is a plain matmul of the flattened g with w
    (w [out, in] is already the right-hand side it needs), and dw transposes whichever of its two
    ways moves fewer elements: g^T x, or (x^T g)^T when g is the wider (a LoRA up-factor's gradient:
    g [rows, 36864] against x [rows, 16])."""
    b = a.b
    x, w = a.operands[0], a.operands[1]
    assert x is not None and w is not None
    g = a.g
    out: list[Var | None] = [None, None, None]
    rows, n_in, n_out = math.prod(x.shape[:-1]), x.shape[-1], g.shape[-1]
    g2 = b.emit("reshape", g, shape=(rows, n_out)) if a.wants[0] or a.wants[1] else g
    if a.wants[0]:
        out[0] = b.emit("reshape", b.emit("matmul", g2, w), shape=x.shape)
    if a.wants[1]:
        x2 = b.emit("reshape", x, shape=(rows, n_in))
        if rows * n_out <= rows * n_in + n_out * n_in:
            out[1] = b.emit("matmul", b.emit("transpose", g2, perm=(1, 0)), x2)
        else:
            dwt = b.emit("matmul", b.emit("transpose", x2, perm=(1, 0)), g2)
            out[1] = b.emit("transpose", dwt, perm=(1, 0))
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
