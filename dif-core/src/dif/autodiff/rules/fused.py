"""VJPs of `dif.ops.fused`, by differentiating the unfused chain each fusion stands for.

Autodiff normally runs before the fusion passes, so these matter only for programs that were fused
first; the rounding of intermediates the fused references do is a straight-through step here.
"""

from __future__ import annotations

from dif.autodiff.composite import vjp_of_chain
from dif.autodiff.registry import VjpArgs, vjp
from dif.ir.builder import ProgramBuilder, Var


def _norm_modulate_chain(b: ProgramBuilder, x: Var, scale: Var, shift: Var, *, kind: str, eps: float) -> Var:
    n = b.emit("rms_norm", x, eps=eps) if kind == "rms" else b.emit("layer_norm", x, eps=eps)
    return b.emit("modulate", n, scale, shift)


def _rms_norm_modulate_chain(
    b: ProgramBuilder, x: Var, w: Var, scale: Var, shift: Var, *, eps: float, offset: float
) -> Var:
    n = b.emit("rms_norm", x, w, eps=eps, offset=offset, round_before_weight=False)
    return b.emit("modulate", n, scale, shift)


def _gated_residual_chain(b: ProgramBuilder, x: Var, gate: Var, y: Var) -> Var:
    return b.emit("add", x, b.emit("mul", gate, y))


def _rms_norm_rope_chain(
    b: ProgramBuilder, x: Var, w: Var, cos: Var, sin: Var, *, eps: float, offset: float, round_before_weight: bool,
    mode: str,
) -> Var:  # fmt: skip
    n = b.emit("rms_norm", x, w, eps=eps, offset=offset, round_before_weight=round_before_weight)
    return b.emit("rope", n, cos, sin, mode=mode)


def _act_mul_chain(b: ProgramBuilder, g: Var, u: Var, *, act: str) -> Var:
    return b.emit("mul", b.emit(act, g), u)


def _linear_add_chain(b: ProgramBuilder, x: Var, w: Var, r: Var, bias: Var | None = None) -> Var:
    return b.emit("add", r, b.emit("linear", x, w, bias))


@vjp("norm_modulate")
def _norm_modulate(a: VjpArgs) -> list[Var | None]:
    return vjp_of_chain(a, _norm_modulate_chain)


@vjp("rms_norm_modulate")
def _rms_norm_modulate(a: VjpArgs) -> list[Var | None]:
    return vjp_of_chain(a, _rms_norm_modulate_chain)


@vjp("gated_residual")
def _gated_residual(a: VjpArgs) -> list[Var | None]:
    return vjp_of_chain(a, _gated_residual_chain)


@vjp("rms_norm_rope", constants=(2, 3))
def _rms_norm_rope(a: VjpArgs) -> list[Var | None]:
    return vjp_of_chain(a, _rms_norm_rope_chain)


@vjp("linear_add")
def _linear_add(a: VjpArgs) -> list[Var | None]:
    return vjp_of_chain(a, _linear_add_chain)


@vjp("act_mul")
def _act_mul(a: VjpArgs) -> list[Var | None]:
    return vjp_of_chain(a, _act_mul_chain)
