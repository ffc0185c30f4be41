"""VJPs of `dif.ops.attention`: sdpa (GQA, masks) and rope.

sdpa's backward recomputes the attention probabilities P with matmul + softmax under the forward's
scale and masks (a fully masked row: zeros), then applies the softmax backward with matmuls. P is
[B, Hq, Sq, Skv] for the duration of one block's backward; a backend with a fused attention backward
(flash) runs `sdpa_backward` instead, which autodiff emits for unmasked half-precision attention (other
backends run the chain through `dif.passes.legalize`). The chain touches P as few times as it can, since at
DiT sizes every pass over P costs more than the matmuls' own epilogues (klein-9B at 1024²: 32 heads x
4608² per block, 13 ms a transpose on the H200): P and dS are never transposed (the products that need
their transposes are formed transposed, from the small operands), the softmax backward's row term is
rowsum(dO ∘ O) over Dv instead of rowsum(dP ∘ P) over Skv (equal: O = P V), and the scale goes on the
[.., D] products instead of on dS.
"""

from __future__ import annotations

import math

import ml_dtypes

from dif.autodiff.emit import const, iota, scale, transpose_last2
from dif.autodiff.registry import VjpArgs, vjp
from dif.ir.builder import ProgramBuilder, Var
from dif.ops.attention import fused_backward_refusal
from dif.passes.legalize import decomposition

_BHSD = (0, 2, 1, 3)  # [B, S, H, D] <-> [B, H, S, D]


def _heads_first(b: ProgramBuilder, x: Var) -> Var:
    return b.emit("transpose", x, perm=_BHSD)


def _repeat_kv(b: ProgramBuilder, x: Var, group: int) -> Var:
    """[B, Hkv, S, D] -> [B, Hkv * group, S, D], kv head h serving query heads h*group .. h*group+group-1."""
    if group == 1:
        return x
    bsz, hkv, s, d = x.shape
    x5 = b.emit("reshape", x, shape=(bsz, hkv, 1, s, d))
    return b.emit("reshape", b.emit("broadcast_to", x5, shape=(bsz, hkv, group, s, d)), shape=(bsz, hkv * group, s, d))


def _sum_groups(b: ProgramBuilder, x: Var, group: int) -> Var:
    """The adjoint of `_repeat_kv`, back in [B, S, Hkv, D]."""
    if group > 1:
        bsz, hq, s, d = x.shape
        x = b.emit("reduce_sum", b.emit("reshape", x, shape=(bsz, hq // group, group, s, d)), axes=(2,))
    return _heads_first(b, x)


def _probabilities(b: ProgramBuilder, q: Var, k: Var, mask: Var | None, s: float, causal: bool) -> Var:
    """softmax(q k^T s) per head, [B, Hq, Sq, Skv] from q [B, Hq, Sq, D] and k [B, Hq, Skv, D], with the
    forward's masks: disallowed logits are pushed to a large negative value and their probabilities set
    to 0 afterwards, so a fully masked row gives zeros as sdpa does."""
    logits = b.emit("matmul", scale(b, q, s), transpose_last2(b, k))
    bsz, _, sq, skv = logits.shape
    keep: list[Var] = []
    if mask is not None:
        keep.append(b.emit("reshape", mask, shape=(bsz, 1, 1, skv)))
    if causal:  # query i sees keys j <= i + (Skv - Sq)
        rows = b.emit("reshape", iota(b, sq), shape=(sq, 1))
        cols = b.emit("reshape", iota(b, skv), shape=(1, skv))
        keep.append(b.emit("less", cols, b.emit("scalar_affine", rows, scale=1.0, bias=skv - sq + 0.5)))
    if not keep:
        return b.emit("softmax", logits, axis=-1)
    low = const(b, -0.5 * float(ml_dtypes.finfo(logits.dtype.np).max), logits.dtype)
    zero = const(b, 0.0, logits.dtype)
    for m in keep:
        logits = b.emit("where", m, logits, low)
    p = b.emit("softmax", logits, axis=-1)
    for m in keep:
        p = b.emit("where", m, p, zero)
    return p


@vjp("sdpa", constants=(3,))
def _sdpa(a: VjpArgs) -> list[Var | None]:
    """Unmasked half-precision attention: one `sdpa_backward` node (flash-attention backward where the
    backend has one, else legalized to the chain below). Otherwise the chain: P recomputed with matmul +
    softmax (the same masks), then dV = P^T dO (as (dO^T P)^T), dS = P (dP - rowsum(dO O)), dQ = (dS K) s,
    dK = (Q^T dS)^T s, kv heads summed over their query-head groups."""
    b = a.b
    q, k, v = a.operands[:3]
    mask = a.operands[3] if len(a.operands) > 3 else None
    assert q is not None and k is not None and v is not None
    if mask is not None and a.wants[3]:
        raise a.refuse(3, "the key mask is boolean")
    s = float(a.attrs["scale"]) or 1.0 / math.sqrt(q.shape[3])
    causal = bool(a.attrs["causal"])
    if mask is None and not causal and not fused_backward_refusal(q.type, k.type, v.type):
        grads = b.emit_multi("sdpa_backward", q, k, v, a.y, a.g, scale=s)
    else:
        grads = _backward_chain(b, q, k, v, a.y, a.g, s, mask=mask, causal=causal, wants=a.wants[:3])
    out: list[Var | None] = [g if want else None for g, want in zip(grads, a.wants, strict=False)]
    return out + [None] * (len(a.operands) - 3)


@decomposition("sdpa_backward")
def _sdpa_backward_chain(
    b: ProgramBuilder, q: Var, k: Var, v: Var, o: Var, do: Var, lse: Var | None = None, *, scale: float
) -> list[Var]:
    """The chain recomputes P itself: the forward's statistics `lse`, where given, are not needed."""
    return _backward_chain(b, q, k, v, o, do, scale or 1.0 / math.sqrt(q.shape[3]))  # type: ignore[return-value]


@decomposition("sdpa_stats")
def _sdpa_stats_chain(b: ProgramBuilder, q: Var, k: Var, v: Var, *, scale: float) -> list[Var]:
    """sdpa itself, and lse = m + log(sum exp(logits - m)) per row with m the row's largest logit, in fp32."""
    s = scale or 1.0 / math.sqrt(q.shape[3])
    kr = _repeat_kv(b, _heads_first(b, k), q.shape[2] // k.shape[2])
    qh = b.emit("cast", _heads_first(b, q), dtype="f32")
    qs = b.emit("scalar_affine", qh, scale=s, bias=0.0)  # (`scale` is the attribute here)
    logits = b.emit("matmul", qs, transpose_last2(b, b.emit("cast", kr, dtype="f32")))
    peak = b.emit("reduce_max", logits, axes=(-1,), keepdims=True)
    total = b.emit("reduce_sum", b.emit("exp", b.emit("sub", logits, peak)), axes=(-1,))
    lse = b.emit("add", b.emit("reshape", peak, shape=total.shape), b.emit("log", total))
    return [b.emit("sdpa", q, k, v, scale=s), lse]


def _backward_chain(
    b: ProgramBuilder, q: Var, k: Var, v: Var, o: Var, g_out: Var, s: float, *, mask: Var | None = None,
    causal: bool = False, wants: tuple[bool, ...] = (True, True, True),
) -> list[Var | None]:  # fmt: skip
    """(dq, dk, dv) of sdpa(q, k, v, mask; s, causal) with output o and cotangent g_out, from core ops
    (None where not wanted)."""
    hq, hkv = q.shape[2], k.shape[2]
    group = hq // hkv
    qh = _heads_first(b, q)
    kr = _repeat_kv(b, _heads_first(b, k), group)
    vr = _repeat_kv(b, _heads_first(b, v), group)
    p = _probabilities(b, qh, kr, mask, s, causal)
    g = _heads_first(b, g_out)  # [B, Hq, Sq, Dv]
    out: list[Var | None] = [None, None, None]
    if wants[2]:  # dV^T = dO^T P: [B, Hq, Dv, Skv]
        dvt = b.emit("matmul", transpose_last2(b, g), p)
        out[2] = _sum_groups(b, transpose_last2(b, dvt), group)
    if wants[0] or wants[1]:
        dp = b.emit("matmul", g, transpose_last2(b, vr))
        # sum_j P_ij dP_ij = dO_i . (sum_j P_ij V_j) = dO_i . O_i: a sum over Dv, not over Skv
        row = b.emit("reduce_sum", b.emit("mul", g, _heads_first(b, o)), axes=(-1,), keepdims=True)
        ds = b.emit("mul", p, b.emit("sub", dp, row))  # unscaled: s goes on the products below
        if wants[0]:
            out[0] = _heads_first(b, scale(b, b.emit("matmul", ds, kr), s))
        if wants[1]:  # dK^T = Q^T dS: [B, Hq, D, Skv]
            dkt = b.emit("matmul", transpose_last2(b, qh), ds)
            out[1] = _sum_groups(b, scale(b, transpose_last2(b, dkt), s), group)
    return out


@vjp("rope", constants=(1, 2))
def _rope(a: VjpArgs) -> list[Var | None]:
    """out = x c + R(x) s on the first r channels, R the rotation, so dx = g c + R^T(g s). Per rotated
    pair (i, j) with R(x)_i = -x_j and R(x)_j = x_i: dx_i = g_i c_i + g_j s_j and dx_j = g_j c_j - g_i s_i,
    which is rope(g; cos, s') with s'_i = -s_j and s'_j = -s_i: one rope over g (the other channels pass
    through as g) and a sign-and-swap of the [S, r] sine table."""
    b = a.b
    cos, sin = a.operands[1], a.operands[2]
    assert cos is not None and sin is not None
    if a.wants[1] or a.wants[2]:
        raise a.refuse(1 if a.wants[1] else 2, "rotary tables are constants of the program (no gradient)")
    return [b.emit("rope", a.g, cos, _transposed_sine(b, sin, str(a.attrs["mode"])), mode=a.attrs["mode"]), None, None]


def _transposed_sine(b: ProgramBuilder, sin: Var, mode: str) -> Var:
    """s' of `_rope`: each rotated pair's two sines swapped and negated ([S, r], as small as the table)."""
    s_len, r = sin.shape
    if mode == "pairs":
        paired = b.emit("reshape", sin, shape=(s_len, r // 2, 2))
        even, odd = b.emit_multi("split", paired, axis=-1, sizes=(1, 1))
        swapped = b.emit("reshape", b.emit("concat", odd, even, axis=-1), shape=(s_len, r))
    else:
        first, second = b.emit_multi("split", sin, axis=-1, sizes=(r // 2, r // 2))
        swapped = b.emit("concat", second, first, axis=-1)
    return b.emit("scalar_affine", swapped, scale=-1.0, bias=0.0)
