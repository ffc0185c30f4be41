"""Elementwise ops: unary math and activations, broadcasting binaries, comparisons, casts."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dif.dtypes import FLOAT_DTYPES, DType
from dif.ir.types import TensorType
from dif.ops._rules import broadcast_shape, fail, float_cases, fp, need_same_dtype, randn, same_float
from dif.ops.registry import AttrSpec, Case, defop

_erf = np.frompyfunc(math.erf, 1, 1)

_UNARY_SHAPES: list[list[tuple[int, ...]]] = [[(2, 3, 5)], [(7,)]]


def _unary_cases(positive: bool = False) -> Callable[[np.random.Generator, DType], list[Case]]:
    def cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
        out = float_cases(rng, dtype, _UNARY_SHAPES)
        if positive:  # domain of log/sqrt/rsqrt/reciprocal: keep well away from 0
            out = [
                Case(c.name, tuple((np.abs(o.astype(np.float32)) + 0.5).astype(o.dtype) for o in c.operands))
                for c in out
            ]
        return out

    return cases


def _unary(name: str, fn: Callable[[np.ndarray], np.ndarray], doc: str, positive: bool = False) -> None:
    def reference(x: np.ndarray) -> np.ndarray:
        return fn(fp(x))

    reference.__doc__ = doc
    defop(name, operands=("x",), infer=same_float, cases=_unary_cases(positive), category="elementwise")(reference)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # split by sign so exp never overflows
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


_unary("neg", np.negative, "neg(x) = -x.")
_unary("abs", np.abs, "abs(x) = |x|.")
_unary("exp", np.exp, "exp(x) = e^x.")
_unary("log", np.log, "log(x): natural logarithm.", positive=True)
_unary("sqrt", np.sqrt, "sqrt(x): square root (x >= 0).", positive=True)
_unary("rsqrt", lambda x: 1 / np.sqrt(x), "rsqrt(x) = 1/sqrt(x).", positive=True)
_unary("reciprocal", lambda x: 1 / x, "reciprocal(x) = 1/x.", positive=True)
_unary("square", np.square, "square(x) = x*x.")
_unary("sin", np.sin, "sin(x), radians.")
_unary("cos", np.cos, "cos(x), radians.")
_unary("tanh", np.tanh, "tanh(x): hyperbolic tangent.")
_unary("sigmoid", _sigmoid, "sigmoid(x) = 1/(1+e^-x), computed without overflow.")
_unary("silu", lambda x: x * _sigmoid(x), "silu(x) = x*sigmoid(x) (a.k.a. swish).")
_unary("relu", lambda x: np.maximum(x, 0), "relu(x) = max(x, 0).")
_unary("round", np.rint, "round(x): the nearest integer, ties to even (as numpy and torch round).")


def gelu_math(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return (0.5 * x * (1 + np.asarray(_erf(x / math.sqrt(2))).astype(x.dtype))).astype(x.dtype)


@defop(
    "gelu",
    operands=("x",),
    attrs=(
        AttrSpec("approximate", "str", "none", ("none", "tanh"), "'none': exact erf form; 'tanh': tanh approximation"),
    ),
    infer=same_float,
    cases=lambda rng, dt: (
        _unary_cases()(rng, dt)
        + [Case(c.name + "-tanh", c.operands, {"approximate": "tanh"}) for c in _unary_cases()(rng, dt)]
    ),
    category="elementwise",
)
def gelu(x: np.ndarray, *, approximate: str) -> np.ndarray:
    """gelu(x) = x*Phi(x) with the exact erf form, or the tanh approximation
    0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))) when approximate='tanh'."""
    return gelu_math(fp(x), approximate)


# -- binaries ----------------------------------------------------------------------------------


def _binary_infer(a: TensorType, b: TensorType, **_: object) -> TensorType:
    return TensorType(broadcast_shape(a.shape, b.shape), need_same_dtype(a, b))


def _binary_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    return float_cases(rng, dtype, [[(2, 3, 4), (2, 3, 4)], [(2, 3, 4), (4,)], [(3, 1), (1, 5)]])


def _binary(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], doc: str, cases=_binary_cases) -> None:  # type: ignore[no-untyped-def]
    def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if a.dtype.kind in "iub":
            return fn(a, b)
        return fn(fp(a), fp(b))

    reference.__doc__ = doc
    defop(name, operands=("a", "b"), infer=_binary_infer, cases=cases, category="elementwise")(reference)


def _pow_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    cases = _binary_cases(rng, dtype)
    return [
        Case(c.name, ((np.abs(c.operands[0].astype(np.float32)) + 0.5).astype(dtype.np), c.operands[1])) for c in cases
    ]


def _div_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    cases = _binary_cases(rng, dtype)
    return [
        Case(c.name, (c.operands[0], (np.abs(c.operands[1].astype(np.float32)) + 0.5).astype(dtype.np))) for c in cases
    ]


_binary("add", np.add, "add(a, b) = a + b with numpy broadcasting; operands share a dtype.")
_binary("sub", np.subtract, "sub(a, b) = a - b with numpy broadcasting.")
_binary("mul", np.multiply, "mul(a, b) = a * b with numpy broadcasting.")
_binary("div", np.divide, "div(a, b) = a / b with numpy broadcasting (true division).", _div_cases)
_binary("maximum", np.maximum, "maximum(a, b): elementwise max with broadcasting.")
_binary("minimum", np.minimum, "minimum(a, b): elementwise min with broadcasting.")
_binary("pow", np.power, "pow(a, b) = a ** b with broadcasting (a > 0 for real results).", _pow_cases)


def _compare_infer(a: TensorType, b: TensorType, **_: object) -> TensorType:
    need_same_dtype(a, b)
    return TensorType(broadcast_shape(a.shape, b.shape), DType.BOOL)


def _compare(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], doc: str) -> None:
    def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return fn(a, b)

    reference.__doc__ = doc

    def cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
        out = _binary_cases(rng, dtype)
        if out:  # make some entries equal so `equal` is exercised
            a = out[0].operands[0].copy()
            out.append(Case("ties", (a, a.copy())))
        return out

    defop(name, operands=("a", "b"), infer=_compare_infer, cases=cases, category="elementwise")(reference)


_compare("less", np.less, "less(a, b) = a < b (bool result, broadcasting).")
_compare("greater", np.greater, "greater(a, b) = a > b (bool result, broadcasting).")
_compare("equal", np.equal, "equal(a, b) = a == b (bool result, broadcasting).")


def _where_infer(cond: TensorType, a: TensorType, b: TensorType, **_: object) -> TensorType:
    if cond.dtype != DType.BOOL:
        raise fail(f"condition must be bool, got {cond}")
    return TensorType(broadcast_shape(cond.shape, a.shape, b.shape), need_same_dtype(a, b))


def _where_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if dtype not in FLOAT_DTYPES:
        return []
    cond = rng.random((3, 4)) > 0.5
    return [Case("3x4", (cond, randn(rng, (3, 4), dtype), randn(rng, (4,), dtype)))]


@defop("where", operands=("cond", "a", "b"), infer=_where_infer, cases=_where_cases, category="elementwise")
def where(cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """where(cond, a, b): a where cond is true, else b; all three broadcast together."""
    return np.where(cond, a, b)


@defop(
    "clamp",
    operands=("x",),
    attrs=(AttrSpec("lo", "float", doc="lower bound"), AttrSpec("hi", "float", doc="upper bound")),
    infer=same_float,
    cases=lambda rng, dt: float_cases(rng, dt, _UNARY_SHAPES, lo=-0.5, hi=0.75),
    category="elementwise",
)
def clamp(x: np.ndarray, *, lo: float, hi: float) -> np.ndarray:
    """clamp(x; lo, hi) = min(max(x, lo), hi)."""
    return np.clip(fp(x), lo, hi)


@defop(
    "scalar_affine",
    operands=("x",),
    attrs=(AttrSpec("scale", "float", 1.0), AttrSpec("bias", "float", 0.0)),
    infer=same_float,
    cases=lambda rng, dt: float_cases(rng, dt, _UNARY_SHAPES, scale=0.5, bias=0.25),
    category="elementwise",
)
def scalar_affine(x: np.ndarray, *, scale: float, bias: float) -> np.ndarray:
    """scalar_affine(x; scale, bias) = x*scale + bias with Python-float constants (fp32 math)."""
    xf = fp(x)
    return xf * xf.dtype.type(scale) + xf.dtype.type(bias)


def _cast_infer(x: TensorType, *, dtype: str) -> TensorType:
    return TensorType(x.shape, DType(dtype))


def _cast_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if dtype not in FLOAT_DTYPES:
        return []
    x = randn(rng, (4, 6), DType.F32, 3.0)
    targets = [d for d in ("f32", "f16", "bf16", "i32") if d != dtype.value]
    return [Case(f"f32->{t}", (x,), {"dtype": t}) for t in targets] + [
        Case(f"{dtype.value}->f32", (x.astype(dtype.np),), {"dtype": "f32"})
    ]


@defop(
    "cast",
    operands=("x",),
    attrs=(AttrSpec("dtype", "dtype", doc="target element type"),),
    infer=_cast_infer,
    cases=_cast_cases,
    category="elementwise",
)
def cast(x: np.ndarray, *, dtype: str) -> np.ndarray:
    """cast(x; dtype): convert element type. Float->float rounds to nearest even;
    float->int truncates toward zero (as C and torch do)."""
    target = DType(dtype).np
    if target.kind in "iub" and x.dtype.kind not in "iub":
        return np.trunc(fp(x)).astype(target)
    return x.astype(target)


def _full_infer(*, shape: tuple[int, ...], value: float, dtype: str) -> TensorType:
    if any(d < 0 for d in shape):
        raise fail(f"negative dimension in shape {list(shape)}")
    return TensorType(shape, DType(dtype))


@defop(
    "full",
    operands=(),
    attrs=(AttrSpec("shape", "ints"), AttrSpec("value", "float"), AttrSpec("dtype", "dtype")),
    infer=_full_infer,
    cases=lambda rng, dt: (
        [Case("2x3", (), {"shape": (2, 3), "value": 1.5, "dtype": dt.value})] if dt in FLOAT_DTYPES else []
    ),
    category="elementwise",
)
def full(*, shape: tuple[int, ...], value: float, dtype: str) -> np.ndarray:
    """full(; shape, value, dtype): a tensor filled with one value."""
    return np.full(shape, value, dtype=np.float32 if DType(dtype).is_float else DType(dtype).np)
