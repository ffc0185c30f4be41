"""The optimizer half of a training step, emitted as DiffIR after the gradients (`dif.autodiff`'s
`extend`): gradient accumulation, clipping by global norm, AdamW. Optimizer state (moments) and the
fp32 master weights are program inputs and outputs, so one step is one program."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var
from dif.passes.legalize import decomposition
from dif.train.schedule import AdamW

LR, BC1, BC2, GRAD_SCALE = "opt.lr", "opt.bias_correction1", "opt.bias_correction2", "opt.grad_scale"
"""Scalar inputs [1] f32 of a step program: learning rate, 1 - beta1^t, 1 - beta2^t, 1 / accumulation."""


def moment_names(name: str) -> tuple[str, str]:
    return f"adam.m.{name}", f"adam.v.{name}"


def accum_name(name: str) -> str:
    return f"accum.{name}"


def _scalar(b: ProgramBuilder, name: str) -> Var:
    return b.input(name, (1,), DType.F32)


def _c(b: ProgramBuilder, value: float) -> Var:
    return b.emit("full", shape=(), value=float(value), dtype=DType.F32.value)


def accumulate(b: ProgramBuilder, grads: Mapping[str, Var]) -> dict[str, Var]:
    """accum.<p> + g for every gradient (accumulators are f32 inputs)."""
    out = {}
    for name, g in grads.items():
        acc = b.input(accum_name(name), g.shape, DType.F32)
        out[name] = b.emit("add", acc, _f32(b, g))
    return out


def _f32(b: ProgramBuilder, v: Var) -> Var:
    return v if v.dtype == DType.F32 else b.emit("cast", v, dtype=DType.F32.value)


def global_norm(b: ProgramBuilder, grads: Sequence[Var]) -> Var:
    """sqrt(sum of every gradient's squared entries), shape []."""
    total = None
    for g in grads:
        s = b.emit("reduce_sum", b.emit("square", g), axes=tuple(range(len(g.shape))))
        total = s if total is None else b.emit("add", total, s)
    assert total is not None
    return b.emit("sqrt", total)


def clip_factor(b: ProgramBuilder, norm: Var, max_norm: float) -> Var:
    """min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_ scales."""
    coef = b.emit("div", _c(b, max_norm), b.emit("scalar_affine", norm, scale=1.0, bias=1e-6))
    return b.emit("minimum", coef, _c(b, 1.0))


def adamw_step(
    b: ProgramBuilder, opt: AdamW, params: Mapping[str, Var], grads: Mapping[str, Var], *, max_norm: float | None
) -> dict[str, Var]:
    """New master weights and moments (labels `name`, `adam.m.name`, `adam.v.name`) and `grad_norm`.

    Per parameter, with g the (scaled, clipped) f32 gradient, exactly torch.optim.AdamW's order:
      p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
      p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)"""
    lr, bc1, bc2, gscale = (_scalar(b, n) for n in (LR, BC1, BC2, GRAD_SCALE))
    scaled = {n: b.emit("mul", _f32(b, g), gscale) for n, g in grads.items()}
    norm = global_norm(b, list(scaled.values()))
    if max_norm is not None:
        factor = clip_factor(b, norm, max_norm)
        scaled = {n: b.emit("mul", g, factor) for n, g in scaled.items()}
    step_size = b.emit("div", lr, bc1)
    root_bc2 = b.emit("sqrt", bc2)
    decay = b.emit("scalar_affine", lr, scale=-opt.weight_decay, bias=1.0)
    out: dict[str, Var] = {"grad_norm": norm}
    betas = {"beta1": opt.beta1, "beta2": opt.beta2, "eps": opt.eps}
    for name, g in scaled.items():
        p = params[name]
        m_name, v_name = moment_names(name)
        m = b.input(m_name, p.shape, DType.F32)
        v = b.input(v_name, p.shape, DType.F32)
        out[name], out[m_name], out[v_name] = b.emit_multi(
            "adamw_update", p, g, m, v, step_size, root_bc2, decay, **betas
        )
    return out


@decomposition("adamw_update")
def _adamw_chain(
    b: ProgramBuilder, p: Var, g: Var, m: Var, v: Var, step_size: Var, root_bc2: Var, decay: Var, *, beta1: float,
    beta2: float, eps: float,
) -> list[Var]:  # fmt: skip
    p = b.emit("mul", p, decay)
    m = b.emit("add", b.emit("scalar_affine", m, scale=beta1), b.emit("scalar_affine", g, scale=1 - beta1))
    g2 = b.emit("square", g)
    v = b.emit("add", b.emit("scalar_affine", v, scale=beta2), b.emit("scalar_affine", g2, scale=1 - beta2))
    denom = b.emit("scalar_affine", b.emit("div", b.emit("sqrt", v), root_bc2), scale=1.0, bias=eps)
    return [b.emit("sub", p, b.emit("mul", step_size, b.emit("div", m, denom))), m, v]
