"""Normalizations, softmax, modulation and gated activations (the elementwise chains around GEMMs)."""

from __future__ import annotations

import math

import numpy as np

from dif.dtypes import DType
from dif.ir.types import TensorType
from dif.ops._rules import broadcast_shape, fail, float_cases, fp, need_float, norm_axis, randn
from dif.ops.elementwise import _erf, _sigmoid, gelu_math
from dif.ops.registry import AttrSpec, Case, defop


def _last_axis_affine(x: TensorType, *params: TensorType | None) -> TensorType:
    need_float(x)
    for p in params:
        if p is not None and p.shape != (x.shape[-1],):
            raise fail(f"affine parameter must be [{x.shape[-1]}], got {p}")
    return x


def _rms_infer(x: TensorType, w: TensorType | None = None, **_: object) -> TensorType:
    return _last_axis_affine(x, w)


def _norm_cases(rng: np.random.Generator, dtype: DType, n_params: int, **attrs: object) -> list[Case]:
    base = float_cases(rng, dtype, [[(2, 5, 32)], [(3, 64)]], **attrs)
    out = list(base)
    for c in base:
        d = c.operands[0].shape[-1]
        params = tuple((1 + randn(rng, (d,), DType.F32, 0.1)).astype(dtype.np) for _ in range(n_params))
        out.append(Case(c.name + "-affine", (*c.operands, *params), dict(attrs)))
    return out


@defop(
    "rms_norm",
    operands=("x", "w?"),
    attrs=(
        AttrSpec("eps", "float", 1e-6),
        AttrSpec("offset", "float", 0.0, doc="added to w before scaling (1.0 for zero-centred weights)"),
        AttrSpec("round_before_weight", "bool", False, doc="cast the normalized x to x's dtype before *w (Qwen)"),
    ),
    infer=_rms_infer,
    cases=lambda rng, dt: (
        _norm_cases(rng, dt, 1)
        + [Case(c.name + "-qwen", c.operands, {"round_before_weight": True}) for c in _norm_cases(rng, dt, 1)[2:]]
        + [Case(c.name + "-offset", c.operands, {"offset": 1.0}) for c in _norm_cases(rng, dt, 1)[2:]]
    ),
    category="norm",
)
def rms_norm(
    x: np.ndarray, w: np.ndarray | None = None, *, eps: float, offset: float, round_before_weight: bool
) -> np.ndarray:
    """rms_norm(x, w?; eps, offset, round_before_weight) over the last axis:
    y = x / sqrt(mean(x^2) + eps) * (w + offset), statistics in fp32.

    round_before_weight=True rounds the normalized value to x's storage dtype before the weight
    multiply (Qwen3's order); otherwise the multiply happens in fp32 (torch.nn.RMSNorm's order)."""
    xf = fp(x)
    y = xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if w is None:
        return y
    if round_before_weight:
        y = fp(y.astype(x.dtype))
    return y * (fp(w) + offset)


def _norm_backward_infer(x: TensorType, g: TensorType, w: TensorType | None = None, **_: object) -> TensorType:
    if g != x:
        raise fail(f"the cotangent must be x's type {x}, got {g}")
    return _last_axis_affine(x, w)


def _norm_backward_cases(rng: np.random.Generator, dtype: DType, **offset: float) -> list[Case]:
    out = []
    for c in _norm_cases(rng, dtype, 1):
        x, *w = c.operands
        g = randn(rng, x.shape, dtype)
        out.append(Case(c.name, (x, g, *w), {"eps": 1e-6}))
        if w and offset:
            out.append(Case(c.name + "-offset", (x, g, *w), {"eps": 1e-6, **offset}))
    return out


def _norm_backward(x: np.ndarray, g: np.ndarray, w: np.ndarray | None, eps: float, centred: bool) -> np.ndarray:
    """dx = r (dn - mean(dn)? - n mean(dn n)) with n = (x - mean(x)?) r, r = 1/sqrt(mean of its squares + eps)."""
    xc = fp(x)
    if centred:
        xc = xc - xc.mean(axis=-1, keepdims=True)
    dn = fp(g) if w is None else fp(g) * w
    r = 1 / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + eps)
    n = xc * r
    inner = dn - n * np.mean(dn * n, axis=-1, keepdims=True)
    return r * (inner - dn.mean(axis=-1, keepdims=True) if centred else inner)


@defop(
    "rms_norm_backward",
    operands=("x", "g", "w?"),
    attrs=(AttrSpec("eps", "float", 1e-6), AttrSpec("offset", "float", 0.0, doc="the forward's weight offset")),
    infer=_norm_backward_infer,
    cases=lambda rng, dt: _norm_backward_cases(rng, dt, offset=1.0),
    category="fused",
)
def rms_norm_backward(
    x: np.ndarray, g: np.ndarray, w: np.ndarray | None = None, *, eps: float, offset: float
) -> np.ndarray:
    """rms_norm_backward(x, g, w?; eps, offset) -> dx: the input gradient of `rms_norm(x, w?; eps, offset)`
    over the last axis whose output received the cotangent g, in one pass over each row (autodiff emits it; a
    backend that does not declare it runs the chain of core ops it stands for, `dif.passes.legalize`). With
    r = 1/sqrt(mean(x^2) + eps), n = x r and dn = g (w + offset): dx = r (dn - n mean(dn n)), in fp32 (the
    forward's rounding before the weight, where asked for, is a straight-through step)."""
    return _norm_backward(x, g, None if w is None else fp(w) + offset, eps, centred=False)


@defop(
    "layer_norm_backward",
    operands=("x", "g", "w?"),
    attrs=(AttrSpec("eps", "float", 1e-5),),
    infer=_norm_backward_infer,
    cases=_norm_backward_cases,
    category="fused",
)
def layer_norm_backward(x: np.ndarray, g: np.ndarray, w: np.ndarray | None = None, *, eps: float) -> np.ndarray:
    """layer_norm_backward(x, g, w?; eps) -> dx: the input gradient of `layer_norm(x, w?, b?; eps)` over the
    last axis whose output received the cotangent g (the bias does not enter it), in one pass over each row
    (autodiff emits it; a backend that does not declare it runs its chain, `dif.passes.legalize`). With
    mu = mean(x), r = 1/sqrt(mean((x - mu)^2) + eps), n = (x - mu) r and dn = g w:
    dx = r (dn - mean(dn) - n mean(dn n)), in fp32."""
    return _norm_backward(x, g, None if w is None else fp(w), eps, centred=True)


def _ln_infer(x: TensorType, w: TensorType | None = None, b: TensorType | None = None, **_: object) -> TensorType:
    return _last_axis_affine(x, w, b)


@defop(
    "layer_norm",
    operands=("x", "w?", "b?"),
    attrs=(AttrSpec("eps", "float", 1e-5),),
    infer=_ln_infer,
    cases=lambda rng, dt: _norm_cases(rng, dt, 2, eps=1e-6),
    category="norm",
)
def layer_norm(x: np.ndarray, w: np.ndarray | None = None, b: np.ndarray | None = None, *, eps: float) -> np.ndarray:
    """layer_norm(x, w?, b?; eps) over the last axis: (x - mean) / sqrt(var + eps) * w + b,
    biased variance, fp32 statistics. Without w/b it is the non-affine LayerNorm."""
    xf = fp(x)
    mu = xf.mean(axis=-1, keepdims=True)
    var = np.mean(np.square(xf - mu), axis=-1, keepdims=True)
    y = (xf - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * fp(w)
    if b is not None:
        y = y + fp(b)
    return y


def _gn_infer(x: TensorType, w: TensorType, b: TensorType, *, groups: int, eps: float) -> TensorType:
    need_float(x)
    if x.rank < 2:
        raise fail(f"group_norm input must be [N, C, ...], got {x}")
    c = x.shape[1]
    if groups <= 0 or c % groups:
        raise fail(f"{c} channels do not split into {groups} groups")
    for p in (w, b):
        if p.shape != (c,):
            raise fail(f"affine parameter must be [{c}], got {p}")
    return x


def _gn_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    cases = float_cases(rng, dtype, [[(2, 8, 5, 6), (8,), (8,)], [(1, 12, 7), (12,), (12,)]], groups=4, eps=1e-6)
    return cases


@defop(
    "group_norm",
    operands=("x", "w", "b"),
    attrs=(AttrSpec("groups", "int"), AttrSpec("eps", "float", 1e-6)),
    infer=_gn_infer,
    cases=_gn_cases,
    category="norm",
)
def group_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, *, groups: int, eps: float) -> np.ndarray:
    """group_norm(x[N, C, ...], w[C], b[C]; groups, eps): normalize each group of C/groups channels
    over (channels in group, all spatial positions), biased variance in fp32, then per-channel affine."""
    xf = fp(x)
    n, c = xf.shape[:2]
    g = xf.reshape(n, groups, -1)
    mu = g.mean(axis=-1, keepdims=True)
    var = np.mean(np.square(g - mu), axis=-1, keepdims=True)
    y = ((g - mu) / np.sqrt(var + eps)).reshape(xf.shape)
    bshape = (1, c) + (1,) * (xf.ndim - 2)
    return y * fp(w).reshape(bshape) + fp(b).reshape(bshape)


def _axis_infer(x: TensorType, *, axis: int, **_: object) -> TensorType:
    need_float(x)
    norm_axis(axis, x.rank)
    return x


@defop(
    "l2_normalize",
    operands=("x",),
    attrs=(AttrSpec("axis", "int", -1), AttrSpec("eps", "float", 1e-12)),
    infer=_axis_infer,
    cases=lambda rng, dt: float_cases(rng, dt, [[(2, 6, 3, 3)]], axis=1) + float_cases(rng, dt, [[(4, 16)]]),
    category="norm",
)
def l2_normalize(x: np.ndarray, *, axis: int, eps: float) -> np.ndarray:
    """l2_normalize(x; axis, eps) = x / max(||x||_2 along axis, eps) (eps bounds the norm, not its square)."""
    xf = fp(x)
    return xf / np.maximum(np.sqrt(np.sum(xf * xf, axis=axis, keepdims=True)), eps)


@defop(
    "softmax",
    operands=("x",),
    attrs=(AttrSpec("axis", "int", -1),),
    infer=_axis_infer,
    cases=lambda rng, dt: float_cases(rng, dt, [[(2, 3, 17)]]) + float_cases(rng, dt, [[(5, 4)]], axis=0),
    category="norm",
)
def softmax(x: np.ndarray, *, axis: int) -> np.ndarray:
    """softmax(x; axis) = exp(x - max) / sum(exp(x - max)), max-subtracted, fp32."""
    xf = fp(x)
    e = np.exp(xf - xf.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def modulate_infer(x: TensorType, scale: TensorType, shift: TensorType) -> TensorType:
    """modulate's type rule (also norm_modulate's): x float, scale and shift of x's dtype broadcasting to x."""
    need_float(x)
    for t in (scale, shift):
        if t.dtype != x.dtype:
            raise fail(f"scale/shift must be {x.dtype.value}, got {t}")
    if broadcast_shape(x.shape, scale.shape, shift.shape) != x.shape:
        raise fail(f"scale {scale} and shift {shift} must broadcast to x {x}")
    return x


@defop(
    "modulate",
    operands=("x", "scale", "shift"),
    infer=modulate_infer,
    cases=lambda rng, dt: float_cases(rng, dt, [[(2, 5, 16), (2, 1, 16), (2, 1, 16)], [(3, 8), (8,), (8,)]]),
    category="norm",
)
def modulate(x: np.ndarray, scale: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """modulate(x, scale, shift) = x * (1 + scale) + shift (adaptive-norm modulation; broadcasting)."""
    return fp(x) * (1 + fp(scale)) + fp(shift)


def _glu_infer(x: TensorType, *, act: str, gated_half: str) -> TensorType:
    need_float(x)
    if x.rank < 1 or x.shape[-1] % 2:
        raise fail(f"last axis must be even to split in halves, got {x}")
    return TensorType((*x.shape[:-1], x.shape[-1] // 2), x.dtype)


_ACTS = {
    "silu": lambda v: v * _sigmoid(v),
    "gelu": lambda v: gelu_math(v, "none"),
    "gelu_tanh": lambda v: gelu_math(v, "tanh"),
}


@defop(
    "glu",
    operands=("x",),
    attrs=(
        AttrSpec("act", "str", "silu", tuple(_ACTS)),
        AttrSpec("gated_half", "str", "first", ("first", "second"), "which half goes through act"),
    ),
    infer=_glu_infer,
    cases=lambda rng, dt: [
        Case(c.name + f"-{act}-{half}", c.operands, {"act": act, "gated_half": half})
        for c in float_cases(rng, dt, [[(2, 3, 16)]])
        for act in _ACTS
        for half in ("first", "second")
    ],
    category="norm",
)
def glu(x: np.ndarray, *, act: str, gated_half: str) -> np.ndarray:
    """glu(x; act, gated_half): split the last axis into halves a | b;
    gated_half='first' gives act(a) * b (FLUX.2 SwiGLU), 'second' gives a * act(b) (diffusers SwiGLU/GEGLU)."""
    xf = fp(x)
    a, b = np.split(xf, 2, axis=-1)
    f = _ACTS[act]
    return f(a) * b if gated_half == "first" else a * f(b)


def _act_grad(v: np.ndarray, act: str) -> np.ndarray:
    """d act / dv for glu's activations, in v's (float) dtype."""
    if act == "silu":
        s = _sigmoid(v)
        return s * (1 + v * (1 - s))
    if act == "gelu_tanh":
        c, k = math.sqrt(2 / math.pi), 0.044715
        t = np.tanh(c * (v + k * v**3))
        return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * k * v * v)
    cdf = 0.5 * (1 + np.asarray(_erf(v / math.sqrt(2))).astype(v.dtype))
    return cdf + v * np.exp(-0.5 * v * v) / math.sqrt(2 * math.pi)


def _glu_backward_infer(x: TensorType, g: TensorType, *, act: str, gated_half: str) -> TensorType:
    y = _glu_infer(x, act=act, gated_half=gated_half)
    if g.shape != y.shape or g.dtype != x.dtype:
        raise fail(f"the cotangent must be glu's output type {y}, got {g}")
    return x


@defop(
    "glu_backward",
    operands=("x", "g"),
    attrs=(
        AttrSpec("act", "str", "silu", tuple(_ACTS)),
        AttrSpec("gated_half", "str", "first", ("first", "second"), "which half goes through act"),
    ),
    infer=_glu_backward_infer,
    cases=lambda rng, dt: [
        Case(c.name + f"-{act}-{half}", c.operands, {"act": act, "gated_half": half})
        for c in float_cases(rng, dt, [[(2, 3, 16), (2, 3, 8)], [(5, 48), (5, 24)]])
        for act in _ACTS
        for half in ("first", "second")
    ],
    category="fused",
)
def glu_backward(x: np.ndarray, g: np.ndarray, *, act: str, gated_half: str) -> np.ndarray:
    """glu_backward(x, g; act, gated_half) -> dx: the gradient of `glu(x; act, gated_half)` whose output
    received the cotangent g, in one pass over x (autodiff emits it for glu; a backend that does not declare
    it runs the chain of core ops it stands for, `dif.passes.legalize`). With the gated half a and the plain
    half b: d a = g * b * act'(a), d b = g * act(a), placed in x's halves."""
    xf, gf = fp(x), fp(g)
    a, b = np.split(xf, 2, axis=-1)
    gated, plain = (a, b) if gated_half == "first" else (b, a)
    d_gated = gf * plain * _act_grad(gated, act)
    d_plain = gf * _ACTS[act](gated)
    return np.concatenate((d_gated, d_plain) if gated_half == "first" else (d_plain, d_gated), axis=-1)
