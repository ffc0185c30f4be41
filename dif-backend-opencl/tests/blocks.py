"""Small multi-node programs for the OpenCL tests: a DiT-style transformer block (adaptive norm
modulation, GQA attention with qk-norm, rope and a key mask, gated residuals, SwiGLU MLP) and a
VAE-style conv block (group norm + silu, 3x3 / 1x1 / strided convs, upsampling, mid attention)."""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program


def transformer_block(dtype: str = "f32", s: int = 12, d: int = 64, heads: int = 4, kv_heads: int = 2) -> Program:
    hd = d // heads
    b = ProgramBuilder(f"block-{dtype}")
    x = b.input("x", (1, s, d), dtype)
    temb = b.input("temb", (1, d), dtype)
    cos = b.input("cos", (s, 8), "f32")
    sin = b.input("sin", (s, 8), "f32")
    mask = b.input("mask", (1, s), "bool")
    p = {name: b.param(name, shape, dtype) for name, shape in [
        ("mod.w", (3 * d, d)), ("mod.b", (3 * d,)), ("qkv.w", ((heads + 2 * kv_heads) * hd, d)),
        ("q_norm.w", (hd,)), ("k_norm.w", (hd,)), ("out.w", (d, heads * hd)), ("out.b", (d,)),
        ("mlp_in.w", (4 * d, d)), ("mlp_out.w", (d, 2 * d)), ("mlp_norm.w", (d,)),
    ]}  # fmt: skip
    mod = b.emit("linear", b.emit("silu", temb), p["mod.w"], p["mod.b"])
    shift, scale, gate = (
        b.emit("reshape", t, shape=(1, 1, d)) for t in b.emit_multi("split", mod, axis=-1, sizes=(d, d, d))
    )
    h = b.emit("modulate", b.emit("layer_norm", x, eps=1e-6), scale, shift)
    q, k, v = b.emit_multi(
        "split", b.emit("linear", h, p["qkv.w"]), axis=-1, sizes=(heads * hd, kv_heads * hd, kv_heads * hd)
    )
    q = b.emit("reshape", q, shape=(1, s, heads, hd))
    k = b.emit("reshape", k, shape=(1, s, kv_heads, hd))
    v = b.emit("reshape", v, shape=(1, s, kv_heads, hd))
    q = b.emit("rope", b.emit("rms_norm", q, p["q_norm.w"], round_before_weight=True), cos, sin, mode="half")
    k = b.emit("rope", b.emit("rms_norm", k, p["k_norm.w"]), cos, sin, mode="half")
    a = b.emit("reshape", b.emit("sdpa", q, k, v, mask), shape=(1, s, heads * hd))
    a = b.emit("linear", a, p["out.w"], p["out.b"])
    x = b.emit("add", x, b.emit("mul", gate, a))
    m = b.emit("rms_norm", x, p["mlp_norm.w"], offset=1.0)
    m = b.emit("linear", b.emit("glu", b.emit("linear", m, p["mlp_in.w"]), act="silu"), p["mlp_out.w"])
    x = b.emit("add", x, m)
    stats = b.emit("reduce_mean", b.emit("square", x), axes=(-1,), keepdims=True)
    b.output(x, b.emit("cast", stats, dtype="f32"))
    return b.build()


def vae_block(dtype: str = "f32", c: int = 8, h: int = 10, w: int = 12) -> Program:
    b = ProgramBuilder(f"vae-{dtype}")
    x = b.input("x", (1, c, h, w), dtype)
    p = {name: b.param(name, shape, dtype) for name, shape in [
        ("gn1.w", (c,)), ("gn1.b", (c,)), ("c1.w", (c, c, 3, 3)), ("c1.b", (c,)),
        ("gn2.w", (c,)), ("gn2.b", (c,)), ("c2.w", (c, c, 3, 3)), ("c2.b", (c,)),
        ("attn.qkv", (3 * c, c)), ("up.w", (c, c, 3, 3)), ("proj.w", (4, c, 1, 1)), ("proj.b", (4,)),
        ("down.w", (4, 4, 3, 3)),
    ]}  # fmt: skip
    r = b.emit("silu", b.emit("group_norm", x, p["gn1.w"], p["gn1.b"], groups=4))
    r = b.emit("conv2d", r, p["c1.w"], p["c1.b"], padding=(1, 1, 1, 1))
    r = b.emit("silu", b.emit("group_norm", r, p["gn2.w"], p["gn2.b"], groups=4))
    r = b.emit("conv2d", r, p["c2.w"], p["c2.b"], padding=(1, 1, 1, 1))
    x = b.emit("add", x, r)
    # single-head mid attention over pixels, head dim = channels
    t = b.emit("transpose", b.emit("reshape", x, shape=(1, c, h * w)), perm=(0, 2, 1))
    q, k, v = b.emit_multi("split", b.emit("linear", t, p["attn.qkv"]), axis=-1, sizes=(c, c, c))
    q, k, v = (b.emit("reshape", z, shape=(1, h * w, 1, c)) for z in (q, k, v))
    a = b.emit("reshape", b.emit("sdpa", q, k, v), shape=(1, h * w, c))
    x = b.emit("add", x, b.emit("reshape", b.emit("transpose", a, perm=(0, 2, 1)), shape=(1, c, h, w)))
    x = b.emit("conv2d", b.emit("upsample_nearest", x, scale=2), p["up.w"], padding=(1, 1, 1, 1))
    x = b.emit("conv2d", x, p["proj.w"], p["proj.b"])
    x = b.emit("pad", x, pads=(0, 0, 0, 0, 1, 1, 1, 1), mode="reflect")
    x = b.emit("conv2d", x, p["down.w"], stride=(2, 2), padding=(0, 1, 0, 1))
    b.output(b.emit("clamp", x, lo=-3.0, hi=3.0))
    return b.build()


def random_bindings(program: Program, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs, weights) of the declared shapes and dtypes; masks keep a few keys per row."""
    rng = np.random.default_rng(seed)

    def draw(name: str, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        if dtype == DType.BOOL:
            out = rng.random(shape) > 0.3
            out[..., 0] = True
            return out
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        scale = 1.0 if name in ("x", "temb", "cos", "sin") else 1.0 / np.sqrt(max(fan_in, 1))
        if name.endswith("norm.w") or name.startswith("gn"):
            return (1 + 0.1 * rng.standard_normal(shape)).astype(dtype.np)
        return (rng.standard_normal(shape) * scale).astype(dtype.np)

    inputs = {v.name: draw(v.name, v.type.shape, v.type.dtype) for v in program.inputs}
    weights = {v.name: draw(v.name, v.type.shape, v.type.dtype) for v in program.params}
    return inputs, weights
