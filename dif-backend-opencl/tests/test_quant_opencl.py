"""The quantized ops on OpenCL beyond the conformance kit: fp8 e4m3 storage (the decoder over all 256 codes and
the encoder over ties, subnormals, overflow and random bit patterns, bit for bit against ml_dtypes), quantize_rows
bit-exact against its reference, the fused producers at bf16, int4_linear as one GEMM that unpacks its weight,
the emulated fp8 attention equal to its reference value for value,
and the profile that lists f8e4m3 storage and the int4 format only, so the int4 pass quantizes for OpenCL and
the W8A8 passes do not."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from dif.ops.attention import sdpa_fp8
from dif.ops.quant import glu_quant, int4_linear, norm_modulate_quant, quantize_rows, quantize_weight_groups
from dif.testing.conformance import run_one_node

F8 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(5)


def run_one(be: Any, op: str, operands: list[np.ndarray], **attrs: Any) -> tuple[list[np.ndarray], list[str]]:
    """One-node program over `operands` as inputs, run on `be`: (results, the kernels it launched)."""
    results, exe = run_one_node(be, op, operands, **attrs)
    return results, [s.kernel for s in exe.steps]


# -- fp8 e4m3 storage ----------------------------------------------------------------------------------------


def test_decoder_matches_ml_dtypes_on_every_code(ocl) -> None:
    codes = np.arange(256, dtype=np.uint8).view(F8)
    (got,), _ = run_one(ocl, "cast", [codes], dtype="f32")
    want = codes.astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and nan.sum() == 2  # 0x7f and 0xff
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))  # -0.0 included


def _encoder_probes() -> np.ndarray:
    """fp32 values around every fp8 value: the values, the ties between neighbours and an ulp either side of
    them, plus subnormals of both formats, the overflow edge (448..480), specials and random bit patterns."""
    finite = np.arange(256, dtype=np.uint8).view(F8).astype(np.float32)
    pos = np.unique(finite[np.isfinite(finite) & (finite >= 0)])  # 0 .. 448, ascending
    ties = ((pos[:-1].astype(np.float64) + pos[1:]) / 2).astype(np.float32)  # exact in fp32
    ties = np.append(ties, np.float32(464))  # between 448 and the absent 480: the last value that rounds to 448
    near = np.concatenate([np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(np.inf))])
    edge = np.linspace(440, 490, 2001, dtype=np.float32)
    specials = np.array([0.0, np.inf, np.nan, 2**-10, 2**-126, 1e-45, 3.4e38], np.float32)
    magnitudes = np.exp2(RNG.uniform(-14, 10, 50_000)).astype(np.float32)
    bits = RNG.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    probes = np.concatenate([pos, ties, near, edge, specials, magnitudes])
    out = np.concatenate([probes, -probes, bits])
    assert out.dtype == np.float32  # a float64 step would round the ulp neighbours back onto the ties
    return out


def test_encoder_matches_ml_dtypes_bit_for_bit(ocl) -> None:
    x = _encoder_probes()
    (got,), kernels = run_one(ocl, "cast", [x], dtype="f8e4m3")
    assert kernels == ["un_convert"]
    with np.errstate(invalid="ignore"):  # ml_dtypes warns as it casts NaN and the overflow to NaN
        want = x.astype(F8)
    bad = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
    assert bad.size == 0, [(float(x[i]), int(got.view(np.uint8)[i]), int(want.view(np.uint8)[i])) for i in bad[:8]]


# -- the ops ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("q", ["f8e4m3", "i8"])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_quantize_rows_is_bit_exact(ocl, q: str, dtype: Any) -> None:
    x = (RNG.standard_normal((37, 1000)) * np.exp2(RNG.uniform(-8, 8, (37, 1)))).astype(dtype)
    x[3] = 0  # an all-zero row: scale 1
    (gq, gs), kernels = run_one(ocl, "quantize_rows", [x], dtype=q)
    wq, ws = quantize_rows(x, dtype=q)
    assert kernels == ["quantize_rows"]
    np.testing.assert_array_equal(gs, ws)
    np.testing.assert_array_equal(gq.view(np.uint8), wq.view(np.uint8))


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))


def assert_quantized_close(got: list[np.ndarray], want: tuple[np.ndarray, np.ndarray], q: str) -> None:
    """At bf16 one rounding of the producer apart moves a row's amax by a bf16 ulp (conformance is f32 only)."""
    (gq, gs), (wq, ws) = got, want
    np.testing.assert_allclose(gs, ws, rtol=1e-2)
    assert rel(gq.astype(np.float32) * gs, wq.astype(np.float32) * ws) < (2e-3 if q == "i8" else 2e-2)
    assert np.mean(gq.astype(np.float32) == wq.astype(np.float32)) > 0.98


@pytest.mark.parametrize("q", ["f8e4m3", "i8"])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_modulate_quant_bf16(ocl, q: str, kind: str) -> None:
    x = RNG.standard_normal((2, 40, 384)).astype(BF16)
    s, t = ((RNG.standard_normal((2, 1, 384)) * 0.3).astype(BF16) for _ in range(2))
    got, kernels = run_one(ocl, "norm_modulate_quant", [x, s, t], kind=kind, eps=1e-6, dtype=q)
    assert kernels == ["norm_modulate", "quantize_rows"]
    assert_quantized_close(got, norm_modulate_quant(x, s, t, kind=kind, eps=1e-6, dtype=q), q)


@pytest.mark.parametrize("q", ["f8e4m3", "i8"])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_glu_quant_bf16(ocl, q: str, act: str) -> None:
    x = RNG.standard_normal((1, 50, 2 * 512)).astype(BF16)
    got, kernels = run_one(ocl, "glu_quant", [x], act=act, gated_half="first", dtype=q)
    assert kernels == ["glu", "quantize_rows"]
    assert_quantized_close(got, glu_quant(x, act=act, gated_half="first", dtype=q), q)


@pytest.mark.parametrize("dtype, group, bound", [(np.float32, 32, 1e-6), (BF16, 64, 8e-3), (BF16, 128, 8e-3)])
def test_int4_linear_unpacks_the_weight_in_the_gemm(ocl, dtype: Any, group: int, bound: float) -> None:
    """One GEMM launch, no dequantized copy; 20 rows x 100 outputs cover partial 64x64 tiles. The weights are
    rounded to x's dtype as the reference rounds them, so fp32 differs by accumulation order only."""
    rows, k, out = 20, 256, 100
    x = RNG.standard_normal((rows, k)).astype(dtype)
    wq, ws = quantize_weight_groups((RNG.standard_normal((out, k)) / 16).astype(np.float32), group)
    bias = (RNG.standard_normal(out) * 0.1).astype(dtype)
    (got,), kernels = run_one(ocl, "int4_linear", [x, wq, ws, bias], group_size=group)
    assert kernels == ["gemm"]
    want = int4_linear(x, wq, ws, bias, group_size=group).astype(dtype)
    assert rel(got, want) < bound


# -- the formats chosen for OpenCL ----------------------------------------------------------------------------


def test_int4_groups_are_chosen_and_w8a8_is_not(ocl) -> None:
    """The profile lists f8e4m3 storage and format:int4-group only: the int4 pass rewrites a DiT block's linears
    for OpenCL and the result runs as one GEMM per linear against the reference; the W8A8 passes skip."""
    from dif.formats import formats_table
    from dif.interp import interpret
    from dif.passes import optimize
    from dif.plan.planner import plan_program
    from dif.weights.quantized import with_quantized_weights

    from .blocks import random_bindings, transformer_block

    profile = ocl.profile()
    assert "f8e4m3" in profile.dtypes
    assert [c for c in profile.capabilities if c.startswith("format:")] == ["format:int4-group"]
    searchable = {v.format for v in formats_table(profile) if v.searchable}
    assert "int4-group" in searchable and not {"fp8-e4m3", "int8"} & searchable
    program = transformer_block("bf16", s=16)
    for name in ("quantize_fp8", "quantize_int8"):
        out, decisions = optimize(program, target=profile, passes=[name])
        assert out is program and decisions[0].verdict == "skipped", decisions
    quantized, decisions = optimize(program, target=profile, passes=["quantize_int4"])
    assert quantized.op_histogram().get("int4_linear") == sum(d.verdict == "applied" for d in decisions) > 0
    inputs, weights = random_bindings(program)
    derived = with_quantized_weights(quantized, weights)
    exe = ocl.prepare(quantized, plan_program(quantized, profile, ocl.budget()), derived)
    int4_nodes = {n.id for n in quantized.nodes if n.op == "int4_linear"}
    assert [s.kernel for s in exe.steps if s.node_id in int4_nodes] == ["gemm"] * len(int4_nodes)
    got, want = exe.run(inputs), interpret(quantized, inputs, derived)
    for name in program.outputs:
        assert rel(got[name], want[name]) < 2e-2, name


@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_fp8_emulated_is_the_reference_value_for_value(ocl, heads: tuple[int, int], masked: bool) -> None:
    """q, k, v on the e4m3 grid at their tensor scales, the numerators rounded to e4m3 in the softmax, the
    output rounded at v's scale: the same values as dif.ops.attention.sdpa_fp8 (fp32 sums in another order move
    almost none of them across an e4m3 rounding boundary), and some percent from exact attention."""
    from dif.ops.attention import sdpa

    hq, hkv = heads
    q = RNG.standard_normal((2, 48, hq, 32)).astype(BF16)
    k, v = (RNG.standard_normal((2, 48, hkv, 32)).astype(BF16) for _ in range(2))
    mask = None
    if masked:
        mask = np.ones((2, 48), bool)
        mask[1, 30:] = False
    (got,), kernels = run_one(ocl, "sdpa_fp8", [q, k, v] + ([mask] if masked else []), scale=0.0, causal=False)
    want = sdpa_fp8(q, k, v, mask, scale=0.0, causal=False).astype(BF16)
    assert "attn_softmax_fp8" in kernels and kernels[-1] == "fp8_round_out"
    assert np.mean(got.astype(np.float32) == want.astype(np.float32)) > 0.999
    assert 0.01 < rel(got, sdpa(q, k, v, mask, scale=0.0, causal=False)) < 0.1
