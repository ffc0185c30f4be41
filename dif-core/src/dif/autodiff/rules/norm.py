"""VJPs of `dif.ops.norm`: rms / layer / group norm, l2_normalize, softmax, modulate, glu."""

from __future__ import annotations

from dif.autodiff.emit import const, mask_of, sum_to
from dif.autodiff.registry import VjpArgs, vjp
from dif.autodiff.rules.elementwise import gelu_grad, silu_grad
from dif.ir.builder import ProgramBuilder, Var
from dif.passes.legalize import decomposition


def _lead_sum(b: ProgramBuilder, v: Var) -> Var:
    """Sum over every axis but the last: the gradient of a per-channel affine parameter."""
    return b.emit("reduce_sum", v, axes=tuple(range(v.type.rank - 1))) if v.type.rank > 1 else v


def _mean_last(b: ProgramBuilder, v: Var) -> Var:
    return b.emit("reduce_mean", v, axes=(-1,), keepdims=True)


def _normalized_backward(b: ProgramBuilder, dn: Var, n: Var, r: Var, *, centred: bool) -> Var:
    """dx of n = (x - mu?) * r over the last axis: r (dn - mean(dn)? - n mean(dn n))."""
    inner = b.emit("sub", dn, b.emit("mul", n, _mean_last(b, b.emit("mul", dn, n))))
    if centred:
        inner = b.emit("sub", inner, _mean_last(b, dn))
    return b.emit("mul", r, inner)


@vjp("rms_norm")
def _rms_norm(a: VjpArgs) -> list[Var | None]:
    """y = n (w + offset), n = x r, r = 1/sqrt(mean(x^2) + eps): dx is one `rms_norm_backward` node (the
    bf16 rounding of n before the weight, when asked for, is a straight-through step)."""
    b, x = a.b, a.x
    w = a.operands[1] if len(a.operands) > 1 else None
    out: list[Var | None] = [None] * len(a.operands)
    if a.wants[0]:
        params = [w] if w is not None else []
        out[0] = b.emit("rms_norm_backward", x, a.g, *params, eps=a.attrs["eps"], offset=a.attrs["offset"])
    if w is not None and a.wants[1]:
        out[1] = _lead_sum(b, b.emit("mul", a.g, b.emit("mul", x, _rms_rstd(b, x, float(a.attrs["eps"])))))
    return out


def _rms_rstd(b: ProgramBuilder, x: Var, eps: float) -> Var:
    return b.emit("rsqrt", b.emit("scalar_affine", _mean_last(b, b.emit("square", x)), scale=1.0, bias=eps))


@decomposition("rms_norm_backward")
def _rms_norm_backward_chain(
    b: ProgramBuilder, x: Var, g: Var, w: Var | None = None, *, eps: float, offset: float
) -> list[Var]:
    r = _rms_rstd(b, x, eps)
    weight = w if w is None or not offset else b.emit("scalar_affine", w, scale=1.0, bias=offset)
    dn = g if weight is None else b.emit("mul", g, weight)
    return [_normalized_backward(b, dn, b.emit("mul", x, r), r, centred=False)]


def _centred(b: ProgramBuilder, x: Var, eps: float) -> tuple[Var, Var]:
    """(n, r) of a layer norm over the last axis: r = 1/sqrt(var + eps), n = (x - mean) r."""
    xc = b.emit("sub", x, _mean_last(b, x))
    r = b.emit("rsqrt", b.emit("scalar_affine", _mean_last(b, b.emit("square", xc)), scale=1.0, bias=eps))
    return b.emit("mul", xc, r), r


@vjp("layer_norm")
def _layer_norm(a: VjpArgs) -> list[Var | None]:
    """dx is one `layer_norm_backward` node; the parameters' gradients are emitted where wanted."""
    b, x = a.b, a.x
    w = a.operands[1] if len(a.operands) > 1 else None
    out: list[Var | None] = [None] * len(a.operands)
    if w is not None and a.wants[1]:
        out[1] = _lead_sum(b, b.emit("mul", a.g, _centred(b, x, a.attrs["eps"])[0]))
    if len(a.operands) > 2 and a.operands[2] is not None and a.wants[2]:
        out[2] = _lead_sum(b, a.g)
    if a.wants[0]:
        out[0] = b.emit("layer_norm_backward", x, a.g, *([w] if w is not None else []), eps=a.attrs["eps"])
    return out


@decomposition("layer_norm_backward")
def _layer_norm_backward_chain(b: ProgramBuilder, x: Var, g: Var, w: Var | None = None, *, eps: float) -> list[Var]:
    n, r = _centred(b, x, eps)
    dn = g if w is None else b.emit("mul", g, w)
    return [_normalized_backward(b, dn, n, r, centred=True)]


@vjp("group_norm")
def _group_norm(a: VjpArgs) -> list[Var | None]:
    """The layer-norm backward on x viewed as [N, groups, C/groups * spatial]."""
    b, x = a.b, a.x
    w = a.operands[1]
    assert w is not None
    nb, c = x.shape[:2]
    grouped = (nb, int(a.attrs["groups"]), -1)
    n_g, r = _centred(b, b.emit("reshape", x, shape=grouped), a.attrs["eps"])
    n = b.emit("reshape", n_g, shape=x.shape)
    bshape = (1, c) + (1,) * (x.type.rank - 2)
    spatial = (0, *range(2, x.type.rank))
    out: list[Var | None] = [None, None, None]
    if a.wants[0]:
        dn = b.emit("reshape", b.emit("mul", a.g, b.emit("reshape", w, shape=bshape)), shape=grouped)
        out[0] = b.emit("reshape", _normalized_backward(b, dn, n_g, r, centred=True), shape=x.shape)
    if a.wants[1]:
        out[1] = b.emit("reduce_sum", b.emit("mul", a.g, n), axes=spatial)
    if a.wants[2]:
        out[2] = b.emit("reduce_sum", a.g, axes=spatial)
    return out


@vjp("l2_normalize")
def _l2_normalize(a: VjpArgs) -> list[Var | None]:
    """y = x / max(|x|, eps): dx = (g - y <g, y> [|x| > eps]) / max(|x|, eps)."""
    b, x = a.b, a.x
    axis, eps = int(a.attrs["axis"]), float(a.attrs["eps"])
    norm = b.emit("sqrt", b.emit("reduce_sum", b.emit("square", x), axes=(axis,), keepdims=True))
    den = b.emit("maximum", norm, const(b, eps, x.dtype))
    active = mask_of(b, b.emit("greater", norm, const(b, eps, x.dtype)), x.dtype)
    dot = b.emit("reduce_sum", b.emit("mul", a.g, a.y), axes=(axis,), keepdims=True)
    radial = b.emit("mul", a.y, b.emit("mul", dot, active))
    return [b.emit("div", b.emit("sub", a.g, radial), den)]


@vjp("softmax")
def _softmax(a: VjpArgs) -> list[Var | None]:
    b = a.b
    dot = b.emit("reduce_sum", b.emit("mul", a.g, a.y), axes=(int(a.attrs["axis"]),), keepdims=True)
    return [b.emit("mul", a.y, b.emit("sub", a.g, dot))]


@vjp("modulate")
def _modulate(a: VjpArgs) -> list[Var | None]:
    """y = x (1 + scale) + shift."""
    b = a.b
    x, s, t = a.operands
    assert x is not None and s is not None and t is not None
    gx = sum_to(b, b.emit("mul", a.g, b.emit("scalar_affine", s, scale=1.0, bias=1.0)), x.shape) if a.wants[0] else None
    gs = sum_to(b, b.emit("mul", a.g, x), s.shape) if a.wants[1] else None
    gt = sum_to(b, a.g, t.shape) if a.wants[2] else None
    return [gx, gs, gt]


def act_and_grad(b: ProgramBuilder, v: Var, act: str) -> tuple[Var, Var]:
    """(act(v), act'(v)) for glu's activations."""
    if act == "silu":
        return b.emit("silu", v), silu_grad(b, v)
    approx = "tanh" if act == "gelu_tanh" else "none"
    return b.emit("gelu", v, approximate=approx), gelu_grad(b, v, approx)


@vjp("glu")
def _glu(a: VjpArgs) -> list[Var | None]:
    """One `glu_backward` node: one pass over x and g where the backend runs it, else the chain below
    (`dif.passes.legalize`), which reads and writes each half several times."""
    return [a.b.emit("glu_backward", a.x, a.g, act=a.attrs["act"], gated_half=a.attrs["gated_half"])]


@decomposition("glu_backward")
def _glu_backward_chain(b: ProgramBuilder, x: Var, g: Var, *, act: str, gated_half: str) -> list[Var]:
    half = x.shape[-1] // 2
    first, second = b.emit_multi("split", x, axis=-1, sizes=(half, half))
    gated, plain = (first, second) if gated_half == "first" else (second, first)
    f, df = act_and_grad(b, gated, act)
    d_gated = b.emit("mul", b.emit("mul", g, plain), df)
    d_plain = b.emit("mul", g, f)
    parts = (d_gated, d_plain) if gated_half == "first" else (d_plain, d_gated)
    return [b.emit("concat", *parts, axis=-1)]
