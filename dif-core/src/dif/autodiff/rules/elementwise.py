"""VJPs of `dif.ops.elementwise`: unary math and activations, broadcasting binaries, where, clamp, casts."""

from __future__ import annotations

import math

from dif.autodiff.emit import const, mask_of, scale, sum_to
from dif.autodiff.registry import VjpArgs, non_differentiable, vjp
from dif.ir.builder import ProgramBuilder, Var

non_differentiable("less", "greater", "equal", "full", "round")  # round: zero almost everywhere


def _mul(b: ProgramBuilder, *xs: Var) -> Var:
    out = xs[0]
    for x in xs[1:]:
        out = b.emit("mul", out, x)
    return out


@vjp("neg")
def _neg(a: VjpArgs) -> list[Var | None]:
    return [a.b.emit("neg", a.g)]


@vjp("abs")
def _abs(a: VjpArgs) -> list[Var | None]:
    b = a.b
    zero = const(b, 0.0, a.x.dtype)
    pos = mask_of(b, b.emit("greater", a.x, zero), a.x.dtype)
    neg = mask_of(b, b.emit("less", a.x, zero), a.x.dtype)
    return [b.emit("mul", a.g, b.emit("sub", pos, neg))]  # sign(x); 0 at 0 as torch


@vjp("exp")
def _exp(a: VjpArgs) -> list[Var | None]:
    return [a.b.emit("mul", a.g, a.y)]


@vjp("log")
def _log(a: VjpArgs) -> list[Var | None]:
    return [a.b.emit("div", a.g, a.x)]


@vjp("sqrt")
def _sqrt(a: VjpArgs) -> list[Var | None]:
    return [a.b.emit("div", a.g, scale(a.b, a.y, 2.0))]


@vjp("rsqrt")
def _rsqrt(a: VjpArgs) -> list[Var | None]:
    b = a.b  # d/dx x^-1/2 = -1/2 y^3
    return [_mul(b, a.g, scale(b, a.y, -0.5), b.emit("square", a.y))]


@vjp("reciprocal")
def _reciprocal(a: VjpArgs) -> list[Var | None]:
    b = a.b
    return [b.emit("neg", b.emit("mul", a.g, b.emit("square", a.y)))]


@vjp("square")
def _square(a: VjpArgs) -> list[Var | None]:
    return [a.b.emit("mul", a.g, scale(a.b, a.x, 2.0))]


@vjp("sin")
def _sin(a: VjpArgs) -> list[Var | None]:
    return [a.b.emit("mul", a.g, a.b.emit("cos", a.x))]


@vjp("cos")
def _cos(a: VjpArgs) -> list[Var | None]:
    b = a.b
    return [b.emit("neg", b.emit("mul", a.g, b.emit("sin", a.x)))]


def one_minus(b: ProgramBuilder, x: Var) -> Var:
    return b.emit("scalar_affine", x, scale=-1.0, bias=1.0)


@vjp("tanh")
def _tanh(a: VjpArgs) -> list[Var | None]:
    b = a.b
    return [b.emit("mul", a.g, one_minus(b, b.emit("square", a.y)))]


@vjp("sigmoid")
def _sigmoid(a: VjpArgs) -> list[Var | None]:
    b = a.b
    return [_mul(b, a.g, a.y, one_minus(b, a.y))]


def silu_grad(b: ProgramBuilder, x: Var) -> Var:
    """d silu / dx = s (1 + x (1 - s)), s = sigmoid(x)."""
    s = b.emit("sigmoid", x)
    return b.emit("mul", s, b.emit("scalar_affine", b.emit("mul", x, one_minus(b, s)), scale=1.0, bias=1.0))


@vjp("silu")
def _silu(a: VjpArgs) -> list[Var | None]:
    return [a.b.emit("mul", a.g, silu_grad(a.b, a.x))]


@vjp("relu")
def _relu(a: VjpArgs) -> list[Var | None]:
    b = a.b
    return [b.emit("mul", a.g, mask_of(b, b.emit("greater", a.x, const(b, 0.0, a.x.dtype)), a.x.dtype))]


_ERF_TERMS = 12  # erf series: at |x| <= 1 (z <= 0.71) the 12th term is below 1e-17


def _normal_cdf_small(b: ProgramBuilder, x: Var) -> Var:
    """Phi(x) = 1/2 + erf(x/sqrt2)/2 by its Maclaurin series (used where |x| <= 1)."""
    z = scale(b, x, 1 / math.sqrt(2))
    z2 = b.emit("square", z)
    term, total = z, z
    for n in range(1, _ERF_TERMS):
        # term_n = term_{n-1} * (-z^2) * (2n-1) / (n (2n+1))
        term = b.emit("mul", term, scale(b, z2, -(2 * n - 1) / (n * (2 * n + 1))))
        total = b.emit("add", total, term)
    return b.emit("scalar_affine", total, scale=1 / math.sqrt(math.pi), bias=0.5)


def gelu_grad(b: ProgramBuilder, x: Var, approximate: str) -> Var:
    """d gelu / dx. Exact form: Phi(x) + x phi(x), with Phi = gelu(x)/x away from 0 (there is no erf
    op) and its series near 0. Tanh form: 0.5(1+t) + 0.5 x (1-t^2) c (1 + 3k x^2)."""
    if approximate == "tanh":
        c, k = math.sqrt(2 / math.pi), 0.044715
        x2 = b.emit("square", x)
        u = scale(b, b.emit("mul", x, b.emit("scalar_affine", x2, scale=k, bias=1.0)), c)
        t = b.emit("tanh", u)
        du = b.emit("scalar_affine", x2, scale=3 * k * c, bias=c)
        left = b.emit("scalar_affine", t, scale=0.5, bias=0.5)
        right = _mul(b, scale(b, x, 0.5), one_minus(b, b.emit("square", t)), du)
        return b.emit("add", left, right)
    one = const(b, 1.0, x.dtype)
    far = b.emit("greater", b.emit("abs", x), one)
    safe_x = b.emit("where", far, x, one)
    cdf = b.emit(
        "where", far, b.emit("div", b.emit("gelu", safe_x, approximate="none"), safe_x), _normal_cdf_small(b, x)
    )
    pdf = scale(b, b.emit("exp", scale(b, b.emit("square", x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return b.emit("add", cdf, b.emit("mul", x, pdf))


@vjp("gelu")
def _gelu(a: VjpArgs) -> list[Var | None]:
    return [a.b.emit("mul", a.g, gelu_grad(a.b, a.x, str(a.attrs["approximate"])))]


# -- binaries ----------------------------------------------------------------------------------


def _two(a: VjpArgs, ga: Var | None, gb: Var | None) -> list[Var | None]:
    b = a.b
    xa, xb = a.operands[0], a.operands[1]
    assert xa is not None and xb is not None
    return [
        sum_to(b, ga, xa.shape) if ga is not None and a.wants[0] else None,
        sum_to(b, gb, xb.shape) if gb is not None and a.wants[1] else None,
    ]


@vjp("add")
def _add(a: VjpArgs) -> list[Var | None]:
    return _two(a, a.g, a.g)


@vjp("sub")
def _sub(a: VjpArgs) -> list[Var | None]:
    return _two(a, a.g, a.b.emit("neg", a.g) if a.wants[1] else None)


@vjp("mul")
def _mul_rule(a: VjpArgs) -> list[Var | None]:
    b, (xa, xb) = a.b, a.operands
    assert xa is not None and xb is not None
    return _two(a, b.emit("mul", a.g, xb) if a.wants[0] else None, b.emit("mul", a.g, xa) if a.wants[1] else None)


@vjp("div")
def _div(a: VjpArgs) -> list[Var | None]:
    b, (xa, xb) = a.b, a.operands
    assert xa is not None and xb is not None
    ga = b.emit("div", a.g, xb) if a.wants[0] else None
    gb = b.emit("neg", b.emit("div", b.emit("mul", a.g, a.y), xb)) if a.wants[1] else None
    return _two(a, ga, gb)


def _pick(a: VjpArgs, op: str) -> list[Var | None]:
    """maximum / minimum: the winner takes the cotangent; ties split it in halves (as torch)."""
    b, (xa, xb) = a.b, a.operands
    assert xa is not None and xb is not None
    dt = a.y.dtype
    wins = mask_of(b, b.emit(op, xa, xb), dt)
    ties = scale(b, mask_of(b, b.emit("equal", xa, xb), dt), 0.5)
    share_a = b.emit("add", wins, ties)
    ga = b.emit("mul", a.g, share_a)
    gb = b.emit("mul", a.g, one_minus(b, share_a))
    return _two(a, ga, gb)


@vjp("maximum")
def _maximum(a: VjpArgs) -> list[Var | None]:
    return _pick(a, "greater")


@vjp("minimum")
def _minimum(a: VjpArgs) -> list[Var | None]:
    return _pick(a, "less")


@vjp("pow")
def _pow(a: VjpArgs) -> list[Var | None]:
    b, (xa, xb) = a.b, a.operands
    assert xa is not None and xb is not None
    ga = _mul(b, a.g, xb, b.emit("div", a.y, xa)) if a.wants[0] else None  # b a^(b-1)
    gb = _mul(b, a.g, a.y, b.emit("log", xa)) if a.wants[1] else None
    return _two(a, ga, gb)


@vjp("where")
def _where(a: VjpArgs) -> list[Var | None]:
    b = a.b
    cond, xa, xb = a.operands
    assert cond is not None and xa is not None and xb is not None
    zero = const(b, 0.0, a.g.dtype)
    ga = sum_to(b, b.emit("where", cond, a.g, zero), xa.shape) if a.wants[1] else None
    gb = sum_to(b, b.emit("where", cond, zero, a.g), xb.shape) if a.wants[2] else None
    return [None, ga, gb]


@vjp("clamp")
def _clamp(a: VjpArgs) -> list[Var | None]:
    b, dt = a.b, a.x.dtype
    below = b.emit("less", a.x, const(b, a.attrs["lo"], dt))
    above = b.emit("greater", a.x, const(b, a.attrs["hi"], dt))
    zero = const(b, 0.0, dt)
    return [b.emit("where", below, zero, b.emit("where", above, zero, a.g))]


@vjp("scalar_affine")
def _scalar_affine(a: VjpArgs) -> list[Var | None]:
    return [scale(a.b, a.g, float(a.attrs["scale"]))]


@vjp("cast")
def _cast(a: VjpArgs) -> list[Var | None]:
    if not a.x.dtype.is_float:
        return [None]
    return [a.g if a.g.dtype == a.x.dtype else a.b.emit("cast", a.g, dtype=a.x.dtype.value)]
