"""Optimizer ops: one update of a parameter and its moments, which `dif.train.optim` emits per parameter
instead of a chain of a dozen elementwise ops over each (a LoRA step updates hundreds of small factors,
so the chain is thousands of tiny kernels)."""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.ir.types import TensorType
from dif.ops._rules import fail
from dif.ops.registry import AttrSpec, Case, defop

F32 = np.float32


def _adamw_infer(
    p: TensorType, g: TensorType, m: TensorType, v: TensorType, step_size: TensorType, root_bc2: TensorType,
    decay: TensorType, **_: object,
) -> tuple[TensorType, TensorType, TensorType]:  # fmt: skip
    for name, t in (("g", g), ("m", m), ("v", v)):
        if t != p:
            raise fail(f"{name} must be the parameter's type {p}, got {t}")
    if p.dtype != DType.F32:
        raise fail(f"the master weights are f32, got {p}")
    for name, t in (("step_size", step_size), ("root_bc2", root_bc2), ("decay", decay)):
        if t.shape not in ((), (1,)) or t.dtype != DType.F32:
            raise fail(f"{name} must be one f32 value ([] or [1]), got {t}")
    return p, p, p


def _adamw_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if dtype != DType.F32:
        return []
    out = []
    for shape in ((16, 24), (4097,)):
        p, g, m = (rng.standard_normal(shape).astype(F32) for _ in range(3))
        v = np.abs(rng.standard_normal(shape)).astype(F32)
        scalars = [np.full((1,), x, F32) for x in (1e-3 / 0.19, np.sqrt(0.0199), 1 - 1e-3 * 0.01)]
        out.append(Case(f"f32-{'x'.join(map(str, shape))}", (p, g, m, v, *scalars), {}))
    return out


@defop(
    "adamw_update",
    operands=("p", "g", "m", "v", "step_size", "root_bc2", "decay"),
    attrs=(AttrSpec("beta1", "float", 0.9), AttrSpec("beta2", "float", 0.999), AttrSpec("eps", "float", 1e-8)),
    infer=_adamw_infer,
    cases=_adamw_cases,
    category="fused",
    num_results=3,
)
def adamw_update(
    p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, step_size: np.ndarray, root_bc2: np.ndarray,
    decay: np.ndarray, *, beta1: float, beta2: float, eps: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """adamw_update(p, g, m, v, step_size, root_bc2, decay; beta1, beta2, eps) -> (p', m', v'): one AdamW
    step of f32 master weights p with the (scaled, clipped) f32 gradient g, in torch.optim.AdamW's order,
    each operation rounded to f32 as the chain of core ops it stands for (`dif.passes.legalize`) rounds it:
    p *= decay; m' = b1 m + (1-b1) g; v' = b2 v + (1-b2) g^2; p' = p - step_size * m' / (sqrt(v') / root_bc2
    + eps). The scalars are step_size = lr / (1 - b1^t), root_bc2 = sqrt(1 - b2^t), decay = 1 - lr wd."""
    b1, b2, e = F32(beta1), F32(beta2), F32(eps)
    m1 = m * b1 + g * F32(1 - beta1)
    v1 = v * b2 + (g * g) * F32(1 - beta2)
    denom = np.sqrt(v1) / root_bc2 + e
    return (p * decay - step_size * (m1 / denom)).astype(F32), m1.astype(F32), v1.astype(F32)
