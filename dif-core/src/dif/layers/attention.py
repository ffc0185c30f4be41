"""Attention building blocks: head projections, per-head q/k norms, RoPE and `sdpa`.

Layouts follow diffusers: activations [B, S, H, hd]. The pieces are generic so double-stream
(joint text+image), single-stream and causal text-encoder attention all compose from them.
"""

from __future__ import annotations

from dif.ir.builder import ProgramBuilder, Var
from dif.layers.basic import linear, rms_norm, split_heads


def project_heads(b: ProgramBuilder, x: Var, name: str, heads: int, head_dim: int, *, bias: bool = False) -> Var:
    """x [B, S, D] -> linear `{name}` -> [B, S, heads, head_dim]."""
    return split_heads(b, linear(b, x, name, heads * head_dim, bias=bias), head_dim)


def head_rms_norm(b: ProgramBuilder, x: Var, name: str | None, *, eps: float, round_before_weight: bool = False) -> Var:
    """Per-head RMS norm (q/k norm) over hd of x [B, S, H, hd]; weight `{name}.weight` [hd]."""
    return rms_norm(b, x, name, eps=eps, round_before_weight=round_before_weight)


def apply_rope(b: ProgramBuilder, x: Var, cos: Var | None, sin: Var | None, *, mode: str) -> Var:
    """Rotate x [B, S, H, hd] with tables cos/sin [S, R] (identity when no tables are given)."""
    if cos is None or sin is None:
        return x
    return b.emit("rope", x, cos, sin, mode=mode)


def attention(
    b: ProgramBuilder,
    q: Var,
    k: Var,
    v: Var,
    *,
    key_mask: Var | None = None,
    causal: bool = False,
    scale: float = 0.0,
) -> Var:
    """sdpa(q [B,Sq,Hq,hd], k/v [B,Skv,Hkv,hd]) merged to [B, Sq, Hq*hd_v]. scale 0 = 1/sqrt(hd)."""
    o = b.emit("sdpa", q, k, v, key_mask, scale=scale, causal=causal)
    bsz, sq, h, dv = o.shape
    return b.emit("reshape", o, shape=(bsz, sq, h * dv))


def qkv_heads(
    b: ProgramBuilder,
    x: Var,
    names: tuple[str, str, str],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    norm_names: tuple[str | None, str | None] | None = None,
    eps: float = 1e-6,
    round_before_weight: bool = False,
    bias: bool = False,
) -> tuple[Var, Var, Var]:
    """Separate q/k/v projections of x [B, S, D] into heads, with optional q/k RMS norms.

    names: checkpoint prefixes of the q, k and v linears; norm_names: prefixes of the q and k
    norms (None: no q/k norm). Returns q [B,S,heads,hd], k and v [B,S,kv_heads,hd]."""
    q = project_heads(b, x, names[0], heads, head_dim, bias=bias)
    k = project_heads(b, x, names[1], kv_heads, head_dim, bias=bias)
    v = project_heads(b, x, names[2], kv_heads, head_dim, bias=bias)
    if norm_names is not None:
        q = head_rms_norm(b, q, norm_names[0], eps=eps, round_before_weight=round_before_weight)
        k = head_rms_norm(b, k, norm_names[1], eps=eps, round_before_weight=round_before_weight)
    return q, k, v
