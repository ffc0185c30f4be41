"""Convolutional VAE blocks (SD/Flux2-style autoencoders) as DiffIR compositions.

Tensors are NCHW. Weight names follow the diffusers module tree relative to `name`
(`norm1`, `conv1`, `conv_shortcut`, `group_norm`, `to_q`, `to_out.0`, `conv` ...).
"""

from __future__ import annotations

from collections.abc import Sequence

from dif.ir.builder import ProgramBuilder, Var
from dif.layers.basic import activation, conv2d, group_norm, linear


def norm_act_conv(
    b: ProgramBuilder,
    x: Var,
    norm_name: str,
    conv_name: str,
    out_channels: int,
    *,
    groups: int,
    eps: float,
    act: str = "silu",
    kernel: int = 3,
) -> Var:
    """GroupNorm -> act -> conv (kernel k, 'same' padding)."""
    h = activation(b, group_norm(b, x, norm_name, groups=groups, eps=eps), act)
    return conv2d(b, h, conv_name, out_channels, kernel, padding=kernel // 2)


def resnet_block_2d(
    b: ProgramBuilder,
    x: Var,
    name: str,
    out_channels: int,
    *,
    groups: int,
    eps: float,
    act: str = "silu",
) -> Var:
    """x + h, h = conv2(act(GN2(conv1(act(GN1 x))))); a 1x1 `conv_shortcut` maps x when C changes."""
    h = norm_act_conv(b, x, f"{name}.norm1", f"{name}.conv1", out_channels, groups=groups, eps=eps, act=act)
    h = norm_act_conv(b, h, f"{name}.norm2", f"{name}.conv2", out_channels, groups=groups, eps=eps, act=act)
    skip = x if x.shape[1] == out_channels else conv2d(b, x, f"{name}.conv_shortcut", out_channels, 1)
    return b.emit("add", skip, h)


def attention_block_2d(b: ProgramBuilder, x: Var, name: str, *, groups: int, eps: float, heads: int = 1) -> Var:
    """Spatial self-attention with residual: x [N,C,H,W] -> GN -> tokens [N,HW,C] -> q,k,v (bias)
    -> sdpa (`heads` heads of C/heads) -> `to_out.0` -> back to NCHW -> + x."""
    n, c, hh, ww = x.shape
    h = group_norm(b, x, f"{name}.group_norm", groups=groups, eps=eps)
    h = b.emit("transpose", b.emit("reshape", h, shape=(n, c, hh * ww)), perm=(0, 2, 1))
    qkv = [linear(b, h, f"{name}.{p}", c, bias=True) for p in ("to_q", "to_k", "to_v")]
    q, k, v = (b.emit("reshape", t, shape=(n, hh * ww, heads, c // heads)) for t in qkv)
    o = b.emit("reshape", b.emit("sdpa", q, k, v), shape=(n, hh * ww, c))
    o = linear(b, o, f"{name}.to_out.0", c, bias=True)
    o = b.emit("reshape", b.emit("transpose", o, perm=(0, 2, 1)), shape=(n, c, hh, ww))
    return b.emit("add", x, o)


def upsample_2d(b: ProgramBuilder, x: Var, name: str, *, out_channels: int | None = None) -> Var:
    """Nearest 2x upsample then 3x3 conv `{name}.conv`."""
    up = b.emit("upsample_nearest", x, scale=2)
    return conv2d(b, up, f"{name}.conv", out_channels or x.shape[1], 3, padding=1)


def downsample_2d(
    b: ProgramBuilder,
    x: Var,
    name: str,
    *,
    out_channels: int | None = None,
    padding: Sequence[int] = (0, 1, 0, 1),
) -> Var:
    """3x3 stride-2 conv `{name}.conv`; default padding zero-pads bottom/right by one (SD/Flux2 VAE)."""
    return conv2d(b, x, f"{name}.conv", out_channels or x.shape[1], 3, stride=2, padding=tuple(padding))
