"""Gated feed-forward blocks (SwiGLU / GeGLU variants) as DiffIR compositions.

Two weight layouts exist in the models dif serves: one fused input projection of width 2F whose
halves are (gate, value) in either order (`glu_ffn_fused`), and separate gate/up/down weights
(`glu_ffn_split`). Which half is gated differs between models: see the opset notes, pitfall 1.
"""

from __future__ import annotations

from dif.ir.builder import ProgramBuilder, Var
from dif.layers.basic import activation, linear


def glu_ffn_fused(
    b: ProgramBuilder,
    x: Var,
    in_name: str,
    out_name: str,
    hidden: int,
    *,
    act: str = "silu",
    gated_half: str = "first",
    bias: bool = False,
    out_features: int | None = None,
) -> Var:
    """x [..., D] -> linear `{in_name}` (2*hidden) -> glu(act, gated_half) -> linear `{out_name}`."""
    y = linear(b, x, in_name, 2 * hidden, bias=bias)
    y = b.emit("glu", y, act=act, gated_half=gated_half)
    return linear(b, y, out_name, out_features or x.shape[-1], bias=bias)


def glu_ffn_split(
    b: ProgramBuilder,
    x: Var,
    gate_name: str,
    up_name: str,
    down_name: str,
    hidden: int,
    *,
    act: str = "silu",
    bias: bool = False,
) -> Var:
    """down(act(gate x) * up x): separate weights `{gate_name}`, `{up_name}` [hidden, D], `{down_name}`."""
    gate = activation(b, linear(b, x, gate_name, hidden, bias=bias), act)
    up = linear(b, x, up_name, hidden, bias=bias)
    return linear(b, b.emit("mul", gate, up), down_name, x.shape[-1], bias=bias)
