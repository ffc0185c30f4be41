"""dif.layers: host tables and the generic block builders, checked against plain numpy (no torch)."""

from __future__ import annotations

import numpy as np
import pytest

from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.layers import (
    attention_block_2d,
    glu_ffn_fused,
    glu_ffn_split,
    linear,
    modulation_chunks,
    resnet_block_2d,
    timestep_mlp,
)
from dif.layers.tables import grid_ids, rope_half_tables, rope_pairs_tables, sinusoidal_embedding


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def _gn(x: np.ndarray, w: np.ndarray, b: np.ndarray, groups: int, eps: float) -> np.ndarray:
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    g = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    return g.reshape(x.shape) * w[None, :, None, None] + b[None, :, None, None]


def _conv3(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    out = np.zeros((x.shape[0], w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i : i + h, j : j + wd], w[:, :, i, j])
    return out + b[None, :, None, None]


def _weights(program, rng, scale=0.3):  # type: ignore[no-untyped-def]
    return {p.name: (rng.standard_normal(p.type.shape) * scale).astype(np.float32) for p in program.params}


# -- host tables ---------------------------------------------------------------------------------


def test_sinusoid_layout_and_values():
    emb = sinusoidal_embedding([0.0, 3.0], 8)
    assert emb.shape == (2, 8) and emb.dtype == np.float32
    np.testing.assert_array_equal(emb[0], [1, 1, 1, 1, 0, 0, 0, 0])  # [cos | sin] at t=0
    freqs = np.exp(-np.log(10000.0) * np.arange(4) / 4)
    np.testing.assert_allclose(emb[1], np.concatenate([np.cos(3 * freqs), np.sin(3 * freqs)]), atol=1e-6)
    flipped = sinusoidal_embedding([3.0], 8, flip_sin_to_cos=False)
    np.testing.assert_array_equal(flipped[0], np.concatenate([emb[1, 4:], emb[1, :4]]))


def test_rope_pairs_tables_repeat_each_angle_per_pair():
    ids = grid_ids([0], [2, 5], [0, 1, 3], [0])
    cos, sin = rope_pairs_tables(ids, (4, 4, 4, 4), theta=100.0)
    assert cos.shape == (6, 16)
    np.testing.assert_array_equal(cos[:, 0::2], cos[:, 1::2])
    # axis 1 (rows) holds 2,2,2,5,5,5; axes 0 and 3 are position 0: cos 1, sin 0
    np.testing.assert_allclose(cos[:, 4], np.cos([2, 2, 2, 5, 5, 5]), atol=1e-7)
    np.testing.assert_allclose(sin[:, 6], np.sin(np.array([2, 2, 2, 5, 5, 5]) / 10.0), atol=1e-7)
    assert np.all(cos[:, :4] == 1) and np.all(sin[:, 12:] == 0)
    np.testing.assert_allclose(cos[:, 8], np.cos([0, 1, 3, 0, 1, 3]), atol=1e-7)


def test_rope_half_tables_duplicate_halves():
    cos, sin = rope_half_tables(np.arange(5), 8, theta=10000.0)
    np.testing.assert_array_equal(cos[:, :4], cos[:, 4:])
    np.testing.assert_allclose(sin[3, 1], np.sin(3 / 10.0), rtol=1e-6)


def test_grid_ids_are_row_major():
    ids = grid_ids([7], [0, 1], [0, 1, 2], [0])
    assert ids.tolist() == [[7, r, c, 0] for r in range(2) for c in range(3)]


# -- builders ------------------------------------------------------------------------------------


def test_linear_declares_checkpoint_names_and_provenance():
    b = ProgramBuilder("t")
    x = b.input("x", (2, 3, 8), "f32")
    with b.scope(module="m", block="blk.0", section="attn"):
        y = linear(b, x, "blk.0.attn.to_q", 16, bias=True)
    b.output(y)
    prog = b.build()
    assert {p.name: p.type.shape for p in prog.params} == {
        "blk.0.attn.to_q.weight": (16, 8),
        "blk.0.attn.to_q.bias": (16,),
    }
    prov = prog.provenance[prog.nodes[0].id]
    assert (prov.module, prov.block, prov.section) == ("m", "blk.0", "attn")
    assert prov.tensors == ("blk.0.attn.to_q.weight", "blk.0.attn.to_q.bias")


@pytest.mark.parametrize("gated_half", ["first", "second"])
def test_glu_ffn_fused_matches_numpy(gated_half):
    b = ProgramBuilder("ffn")
    x = b.input("x", (2, 4, 6), "f32")
    b.output(glu_ffn_fused(b, x, "ff.linear_in", "ff.linear_out", 5, gated_half=gated_half))
    prog = b.build()
    rng = np.random.default_rng(0)
    w = _weights(prog, rng)
    xv = rng.standard_normal((2, 4, 6)).astype(np.float32)
    y = xv @ w["ff.linear_in.weight"].T
    a, g = y[..., :5], y[..., 5:]
    hidden = _silu(a) * g if gated_half == "first" else a * _silu(g)
    expected = hidden @ w["ff.linear_out.weight"].T
    got = interpret(prog, {"x": xv}, w)[prog.outputs[0]]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_glu_ffn_split_matches_numpy():
    b = ProgramBuilder("mlp")
    x = b.input("x", (3, 6), "f32")
    b.output(glu_ffn_split(b, x, "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", 7))
    prog = b.build()
    rng = np.random.default_rng(1)
    w = _weights(prog, rng)
    xv = rng.standard_normal((3, 6)).astype(np.float32)
    hidden = _silu(xv @ w["mlp.gate_proj.weight"].T) * (xv @ w["mlp.up_proj.weight"].T)
    expected = hidden @ w["mlp.down_proj.weight"].T
    np.testing.assert_allclose(interpret(prog, {"x": xv}, w)[prog.outputs[0]], expected, rtol=1e-5, atol=1e-5)


def test_time_mlp_and_modulation_chunks():
    b = ProgramBuilder("mod")
    proj = b.input("proj", (2, 8), "f32")
    temb = timestep_mlp(b, proj, "time", 6, bias=False)
    chunks = modulation_chunks(b, b.emit("silu", temb), "mod.linear", 3)
    assert [c.shape for c in chunks] == [(2, 1, 6)] * 3
    b.output(*chunks)
    prog = b.build()
    rng = np.random.default_rng(2)
    w = _weights(prog, rng)
    pv = rng.standard_normal((2, 8)).astype(np.float32)
    t = _silu(pv @ w["time.linear_1.weight"].T) @ w["time.linear_2.weight"].T
    m = _silu(t) @ w["mod.linear.weight"].T
    outs = interpret(prog, {"proj": pv}, w)
    for i, name in enumerate(prog.outputs):
        np.testing.assert_allclose(outs[name][:, 0], m[:, 6 * i : 6 * (i + 1)], rtol=1e-5, atol=1e-5)


def test_resnet_and_attention_block_match_numpy():
    b = ProgramBuilder("vae")
    x = b.input("x", (1, 8, 3, 4), "f32")
    h = resnet_block_2d(b, x, "res", 4, groups=2, eps=1e-6)
    b.output(attention_block_2d(b, h, "attn", groups=2, eps=1e-6))
    prog = b.build()
    assert "res.conv_shortcut.weight" in {p.name for p in prog.params}
    rng = np.random.default_rng(3)
    w = _weights(prog, rng)
    for n in ("res.norm1.weight", "res.norm2.weight", "attn.group_norm.weight"):
        w[n] = (1 + w[n]).astype(np.float32)
    xv = rng.standard_normal((1, 8, 3, 4)).astype(np.float32)

    def p(name: str) -> np.ndarray:
        return w[name].astype(np.float64)

    r = _conv3(
        _silu(_gn(xv, p("res.norm1.weight"), p("res.norm1.bias"), 2, 1e-6)), p("res.conv1.weight"), p("res.conv1.bias")
    )
    r = _conv3(
        _silu(_gn(r, p("res.norm2.weight"), p("res.norm2.bias"), 2, 1e-6)), p("res.conv2.weight"), p("res.conv2.bias")
    )
    skip = np.einsum("nchw,oc->nohw", xv, p("res.conv_shortcut.weight")[:, :, 0, 0])
    hv = skip + p("res.conv_shortcut.bias")[None, :, None, None] + r
    t = _gn(hv, p("attn.group_norm.weight"), p("attn.group_norm.bias"), 2, 1e-6).reshape(1, 4, 12).transpose(0, 2, 1)
    q, k, v = (t @ p(f"attn.{n}.weight").T + p(f"attn.{n}.bias") for n in ("to_q", "to_k", "to_v"))
    s = q @ k.transpose(0, 2, 1) / 2.0
    a = np.exp(s - s.max(-1, keepdims=True))
    o = (a / a.sum(-1, keepdims=True)) @ v
    o = o @ p("attn.to_out.0.weight").T + p("attn.to_out.0.bias")
    expected = hv + o.transpose(0, 2, 1).reshape(1, 4, 3, 4)
    got = interpret(prog, {"x": xv}, w)[prog.outputs[0]]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
