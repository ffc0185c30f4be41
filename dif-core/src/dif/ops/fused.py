"""Fused ops: the ones optimizer passes (`dif.passes`) put in place of a short chain of core ops.

Frontends never emit these. Each reference calls the references of the ops it replaces and
rounds every intermediate to the dtype the unfused program stored it in, so a fused program gives
bit-identical results to the unfused one on the CPU backend. A backend runs a fusion's output
only if it declares `op:<name>` in its `TargetProfile.capabilities` (the pass checks that).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from dif.dtypes import DType
from dif.ir.types import TensorType
from dif.ops._rules import broadcast_shape, fail, float_cases, fp, need_float, need_rank, randn
from dif.ops.attention import check_rope_tables, rope, rope_case_tables
from dif.ops.norm import layer_norm, modulate, modulate_infer, rms_norm
from dif.ops.registry import OPS, AttrSpec, Case, defop


def _stored(value: np.ndarray | tuple[np.ndarray, ...], like: np.ndarray) -> np.ndarray:
    """`value` (one reference result) rounded to `like`'s dtype, as the unfused program stored it,
    back in compute precision."""
    return fp(_one(value).astype(like.dtype, copy=False))


def _one(value: np.ndarray | tuple[np.ndarray, ...]) -> np.ndarray:
    """The single result of a one-result reference (references are typed as possibly multi-result)."""
    return cast(np.ndarray, value)


# -- norm_modulate ---------------------------------------------------------------------------------


def _norm_modulate_infer(x: TensorType, scale: TensorType, shift: TensorType, *, kind: str, eps: float) -> TensorType:
    return modulate_infer(x, scale, shift)  # the norm keeps x's type, so modulate's rule is the whole rule


def _norm_modulate_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    shapes: list[list[tuple[int, ...]]] = [[(2, 5, 32), (2, 1, 32), (2, 1, 32)], [(3, 64), (64,), (64,)]]
    out = []
    for kind in ("layer", "rms"):
        cases = float_cases(rng, dtype, shapes)
        out += [Case(f"{c.name}-{kind}", c.operands, {"kind": kind, "eps": 1e-6}) for c in cases]
    return out


@defop(
    "norm_modulate",
    operands=("x", "scale", "shift"),
    attrs=(
        AttrSpec(
            "kind",
            "str",
            doc="'layer': layer_norm(x) without affine; 'rms': rms_norm(x) without weight",
            choices=("layer", "rms"),
        ),
        AttrSpec("eps", "float", doc="the norm's eps"),
    ),  # fmt: skip
    infer=_norm_modulate_infer,
    cases=_norm_modulate_cases,
    category="fused",
)
def norm_modulate(x: np.ndarray, scale: np.ndarray, shift: np.ndarray, *, kind: str, eps: float) -> np.ndarray:
    """norm_modulate(x, scale, shift; kind, eps) = modulate(norm(x), scale, shift) over the last axis,
    where norm is layer_norm(x; eps) (kind='layer') or rms_norm(x; eps) (kind='rms'), both without
    affine parameters. The normalized value is rounded to x's dtype before the modulation, exactly
    as the unfused pair stores it. scale and shift broadcast to x (made by `fuse_norm_modulate`)."""
    rms = kind == "rms"
    y = rms_norm(x, eps=eps, offset=0.0, round_before_weight=False) if rms else layer_norm(x, eps=eps)
    return _one(modulate(_stored(y, x), scale, shift))


# -- rms_norm_modulate -----------------------------------------------------------------------------


def _rms_norm_modulate_infer(
    x: TensorType, w: TensorType, scale: TensorType, shift: TensorType, *, eps: float, offset: float
) -> TensorType:
    if w.rank != 1 or w.shape[0] != x.shape[-1] or w.dtype not in (x.dtype, DType.F32):
        raise fail(f"the norm weight must be ({x.shape[-1]},) of x's dtype {x.dtype.value} or f32, got {w}")
    return modulate_infer(x, scale, shift)


def _rms_norm_modulate_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    shapes: list[list[tuple[int, ...]]] = [[(2, 5, 32), (32,), (2, 1, 32), (2, 1, 32)], [(3, 64), (64,), (64,), (64,)]]
    out = []
    for offset in (0.0, 1.0):
        cases = float_cases(rng, dtype, shapes)
        out += [Case(f"{c.name}-offset{offset:g}", c.operands, {"eps": 1e-5, "offset": offset}) for c in cases]
    return out


RMS_NORM_MODULATE_ATTRS = (
    AttrSpec("eps", "float", doc="as in rms_norm"),
    AttrSpec("offset", "float", 0.0, doc="as in rms_norm: added to w before scaling"),
)
"""The attributes of rms_norm_modulate, which rms_norm_modulate_quant shares."""


@defop(
    "rms_norm_modulate",
    operands=("x", "w", "scale", "shift"),
    attrs=RMS_NORM_MODULATE_ATTRS,
    infer=_rms_norm_modulate_infer,
    cases=_rms_norm_modulate_cases,
    category="fused",
)
def rms_norm_modulate(
    x: np.ndarray, w: np.ndarray, scale: np.ndarray, shift: np.ndarray, *, eps: float, offset: float
) -> np.ndarray:
    """rms_norm_modulate(x, w, scale, shift; eps, offset) = modulate(rms_norm(x, w; eps, offset), scale, shift)
    over the last axis, the norm weighted (w of x's dtype or f32, as torch.nn.RMSNorm's order:
    `round_before_weight` off) and its value rounded to x's dtype before the modulation, exactly as the unfused
    pair stores it: Krea 2's adaptive norms (made by `fuse_norm_modulate`)."""
    y = rms_norm(x, w, eps=eps, offset=offset, round_before_weight=False)
    return _one(modulate(_stored(y, x), scale, shift))


# -- gated_residual --------------------------------------------------------------------------------


def _gated_residual_infer(x: TensorType, gate: TensorType, y: TensorType) -> TensorType:
    need_float(x)
    if not x.dtype == gate.dtype == y.dtype:
        raise fail(f"x, gate and y must share one dtype, got {x}, {gate}, {y}")
    return TensorType(broadcast_shape(x.shape, broadcast_shape(gate.shape, y.shape)), x.dtype)


def _gated_residual_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    shapes: list[list[tuple[int, ...]]] = [
        [(2, 5, 16), (2, 1, 16), (2, 5, 16)],  # adaLN gate broadcast over tokens
        [(3, 8), (8,), (3, 8)],
        [(16,), (2, 1, 16), (2, 5, 16)],  # the product is larger than the residual
    ]
    return float_cases(rng, dtype, shapes)


@defop(
    "gated_residual",
    operands=("x", "gate", "y"),
    infer=_gated_residual_infer,
    cases=_gated_residual_cases,
    category="fused",
)
def gated_residual(x: np.ndarray, gate: np.ndarray, y: np.ndarray) -> np.ndarray:
    """gated_residual(x, gate, y) = add(x, mul(gate, y)) with numpy broadcasting of all three; the
    product is rounded to the operands' dtype before the add, exactly as the unfused pair stores it
    (made by `fuse_gated_residual`)."""
    product = np.multiply(fp(gate), fp(y))
    return np.add(fp(x), _stored(product, gate))


# -- act_mul ---------------------------------------------------------------------------------------

ACT_MUL_ACTS = ("silu", "sigmoid")
"""The activations act_mul (and act_mul_quant) apply to the gate: those the unfused `silu` / `sigmoid` compute."""


def _act_mul_infer(g: TensorType, u: TensorType, *, act: str) -> TensorType:
    need_float(g)
    if g != u:
        raise fail(f"the gate g {g} and the value u {u} must share one type")
    return g


def _act_mul_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    cases = float_cases(rng, dtype, [[(2, 5, 24), (2, 5, 24)], [(7,), (7,)]])
    return [Case(f"{c.name}-{act}", c.operands, {"act": act}) for c in cases for act in ACT_MUL_ACTS]


@defop(
    "act_mul",
    operands=("g", "u"),
    attrs=(AttrSpec("act", "str", "silu", ACT_MUL_ACTS, "applied to g"),),
    infer=_act_mul_infer,
    cases=_act_mul_cases,
    category="fused",
)
def act_mul(g: np.ndarray, u: np.ndarray, *, act: str) -> np.ndarray:
    """act_mul(g, u; act) = mul(act(g), u) over g and u of one type, the activation rounded to g's dtype before
    the product, exactly as the unfused pair stores it: a gate computed apart from its value (Krea 2's SwiGLU,
    silu(gate) * up, and its attention output times sigmoid(gate)) in one pass (made by `fuse_act_mul`)."""
    return np.multiply(_stored(OPS.get(act).reference(g), g), fp(u))


# -- rms_norm_rope ---------------------------------------------------------------------------------


def _rms_norm_rope_infer(
    x: TensorType,
    w: TensorType,
    cos: TensorType,
    sin: TensorType,
    *,
    eps: float,
    offset: float,
    round_before_weight: bool,
    mode: str,
) -> TensorType:
    need_float(x, cos, sin)
    need_rank(x, 4, what="x [B, S, H, D]")
    if w.shape != (x.shape[-1],):
        raise fail(f"weight must be [{x.shape[-1]}], got {w}")
    check_rope_tables(x, cos, sin)
    return x


def _rms_norm_rope_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if not dtype.is_float or dtype in (DType.F8E4M3, DType.F8E5M2):
        return []
    x = randn(rng, (2, 5, 3, 16), dtype)
    w = (1 + randn(rng, (16,), DType.F32, 0.1)).astype(dtype.np)
    cos_p, sin_p, cos_h, sin_h = rope_case_tables(rng)
    return [
        Case("pairs-full", (x, w, cos_p, sin_p), {"mode": "pairs"}),
        Case("pairs-partial-qwen", (x, w, cos_p[:, :8], sin_p[:, :8]), {"mode": "pairs", "round_before_weight": True}),
        Case("half-full-qwen", (x, w, cos_h, sin_h), {"mode": "half", "round_before_weight": True}),
        Case("half-partial-offset", (x, w, cos_h[:, :12], sin_h[:, :12]), {"mode": "half", "offset": 1.0}),
    ]


RMS_NORM_ROPE_ATTRS = (
    AttrSpec("eps", "float", 1e-6),
    AttrSpec("offset", "float", 0.0, doc="added to w before scaling, as in rms_norm"),
    AttrSpec("round_before_weight", "bool", False, doc="as in rms_norm"),
    AttrSpec("mode", "str", "half", ("pairs", "half"), "as in rope"),
)
"""The attributes of rms_norm_rope, which rms_norm_rope_quant shares."""


@defop(
    "rms_norm_rope",
    operands=("x", "w", "cos", "sin"),
    attrs=RMS_NORM_ROPE_ATTRS,
    infer=_rms_norm_rope_infer,
    cases=_rms_norm_rope_cases,
    category="fused",
)
def rms_norm_rope(
    x: np.ndarray,
    w: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    *,
    eps: float,
    offset: float,
    round_before_weight: bool,
    mode: str,
) -> np.ndarray:
    """rms_norm_rope(x[B,S,H,D], w[D], cos[S,R], sin[S,R]; eps, offset, round_before_weight, mode)
    = rope(rms_norm(x, w; eps, offset, round_before_weight), cos, sin; mode): the per-head q/k norm
    and the rotary embedding in one pass. The normalized value is rounded to x's dtype before the
    rotation, exactly as the unfused pair stores it (made by `fuse_norm_rope`)."""
    y = rms_norm(x, w, eps=eps, offset=offset, round_before_weight=round_before_weight)
    return _one(rope(_stored(y, x), cos, sin, mode=mode))


# -- linear_add ------------------------------------------------------------------------------------


def _linear_add_infer(x: TensorType, w: TensorType, r: TensorType, bias: TensorType | None = None) -> TensorType:
    y = OPS.get("linear").infer(x, w, bias)  # linear's own rule (dtypes, feature counts, bias shape)
    if r != y:  # no broadcast: the residual is read exactly where the product is written
        raise fail(f"residual must be exactly the linear's result {y}, got {r}")
    return y


def _linear_add_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    with_bias = float_cases(rng, dtype, [[(2, 5, 16), (8, 16), (2, 5, 8), (8,)], [(3, 7), (5, 7), (3, 5), (5,)]])
    no_bias = float_cases(rng, dtype, [[(4, 32), (24, 32), (4, 24)], [(1, 6, 16), (16, 16), (1, 6, 16)]])
    return [Case(f"{c.name}-bias", c.operands) for c in with_bias] + no_bias


@defop(
    "linear_add",
    operands=("x", "w", "r", "bias?"),
    infer=_linear_add_infer,
    cases=_linear_add_cases,
    category="fused",
)
def linear_add(x: np.ndarray, w: np.ndarray, r: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """linear_add(x[..., in], w[out, in], r[..., out], bias?[out]) -> [..., out] = r + linear(x, w, bias):
    a linear and the residual add after it in one op (a GEMM whose epilogue adds r). r has exactly the
    result's shape and dtype (no broadcast). The linear's result is rounded to x's dtype before the add,
    exactly as the unfused pair stores it (made by `fuse_linear_residual`; the optional bias is last,
    as optional operands are)."""
    product = OPS.get("linear").reference(x, w, bias)  # the table's linear, whatever reference it has now
    return np.add(fp(r), _stored(product, x))
