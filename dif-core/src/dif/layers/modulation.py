"""Timestep conditioning pieces: the time MLP and adaLN modulation (shift/scale/gate) helpers.

The sinusoid itself is a host table (`dif.layers.tables.sinusoidal_embedding`); programs take it
as an input and run the MLP and the modulation linears. Chunk order is the caller's business
(it differs between models: opset notes, pitfall 2).
"""

from __future__ import annotations

from collections.abc import Sequence

from dif.ir.builder import ProgramBuilder, Var
from dif.layers.basic import activation, chunk, linear


def timestep_mlp(
    b: ProgramBuilder,
    proj: Var,
    name: str,
    dim: int,
    *,
    act: str = "silu",
    bias: bool = True,
    layer_names: tuple[str, str] = ("linear_1", "linear_2"),
) -> Var:
    """proj [B, C] -> `{name}.linear_1` -> act -> `{name}.linear_2` -> [B, dim]."""
    h = linear(b, proj, f"{name}.{layer_names[0]}", dim, bias=bias)
    return linear(b, activation(b, h, act), f"{name}.{layer_names[1]}", dim, bias=bias)


def modulation_chunks(b: ProgramBuilder, cond: Var, name: str, n_chunks: int, *, bias: bool = False) -> tuple[Var, ...]:
    """cond [B, Dc] (already activated) -> linear `{name}` (n_chunks*D) -> n_chunks tensors [B, 1, D].

    D is cond's width. The [B, 1, D] shape broadcasts over the token axis of [B, S, D]."""
    dim = cond.shape[-1]
    mod = linear(b, cond, name, n_chunks * dim, bias=bias)
    pieces = chunk(b, mod, n_chunks, axis=-1)
    return tuple(b.emit("reshape", p, shape=(p.shape[0], 1, dim)) for p in pieces)


def modulated_layer_norm(b: ProgramBuilder, x: Var, shift: Var, scale: Var, *, eps: float) -> Var:
    """LayerNorm without affine, then x*(1+scale)+shift (scale/shift broadcast over tokens)."""
    return b.emit("modulate", b.emit("layer_norm", x, eps=eps), scale, shift)


def gated_residual(b: ProgramBuilder, x: Var, gate: Var, y: Var) -> Var:
    """x + gate * y."""
    return b.emit("add", x, b.emit("mul", gate, y))


def split_tokens(b: ProgramBuilder, x: Var, sizes: Sequence[int]) -> tuple[Var, ...]:
    """Split x [B, S, D] along the sequence axis."""
    return b.emit_multi("split", x, axis=1, sizes=tuple(sizes))
