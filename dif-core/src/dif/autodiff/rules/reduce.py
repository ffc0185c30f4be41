"""VJPs of `dif.ops.reduce`."""

from __future__ import annotations

import math

from dif.autodiff.emit import mask_of, scale
from dif.autodiff.registry import VjpArgs, vjp
from dif.ir.builder import ProgramBuilder, Var


def _kept(a: VjpArgs, v: Var) -> Var:
    """A reduced value reshaped to keepdims form, so it broadcasts against x."""
    axes = {ax % a.x.type.rank for ax in a.attrs["axes"]}
    shape = tuple(1 if i in axes else d for i, d in enumerate(a.x.shape))
    return v if v.shape == shape else a.b.emit("reshape", v, shape=shape)


def _spread(b: ProgramBuilder, v: Var, x: Var) -> Var:
    return b.emit("broadcast_to", v, shape=x.shape)


@vjp("reduce_sum")
def _sum(a: VjpArgs) -> list[Var | None]:
    return [_spread(a.b, _kept(a, a.g), a.x)]


@vjp("reduce_mean")
def _mean(a: VjpArgs) -> list[Var | None]:
    count = math.prod(a.x.shape[ax] for ax in a.attrs["axes"])
    return [_spread(a.b, scale(a.b, _kept(a, a.g), 1.0 / count), a.x)]


@vjp("reduce_max")
def _max(a: VjpArgs) -> list[Var | None]:
    """The cotangent goes to the maxima, split evenly between ties."""
    b = a.b
    hit = mask_of(b, b.emit("equal", a.x, _kept(a, a.y)), a.x.dtype)
    ties = b.emit("reduce_sum", hit, axes=tuple(a.attrs["axes"]), keepdims=True)
    return [b.emit("mul", hit, b.emit("div", _kept(a, a.g), ties))]
