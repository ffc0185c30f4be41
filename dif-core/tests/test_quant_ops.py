"""The quantized ops' references (dif.ops.quant) against independent computations: the value grids, the
scales, int4 packing by hand, torch's float8_e4m3fn rounding, and the W8A8 / int4 GEMMs against float64
products of the dequantized operands."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dif.ops.fused import norm_modulate
from dif.ops.quant import (
    dequantize_groups,
    int4_linear,
    norm_modulate_quant,
    quantize_rows,
    quantize_weight_groups,
    quantize_weight_rows,
    scaled_linear,
)

RNG = np.random.default_rng(7)


def test_int8_rows_hit_127_and_round_to_nearest() -> None:
    x = RNG.standard_normal((6, 50)).astype(np.float32) * 3
    q, s = quantize_rows(x, dtype="i8")
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (6, 1)
    assert np.all(np.max(np.abs(q.astype(np.int32)), axis=1) == 127)  # each row's amax maps to 127
    np.testing.assert_allclose(s[:, 0], np.max(np.abs(x), axis=1) / 127, rtol=1e-7)
    err = np.abs(q.astype(np.float64) * s - x)
    assert np.all(err <= s * 0.5 * (1 + 1e-6))  # nearest: within half a quantum


def test_fp8_rows_match_torch_rounding() -> None:
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    x[2] *= 1e-3  # a small row: the scale keeps it on the full grid
    q, s = quantize_rows(x, dtype="f8e4m3")
    assert q.dtype == ml_dtypes.float8_e4m3fn
    want = torch.from_numpy(x / s).to(torch.float8_e4m3fn).to(torch.float32).numpy()
    np.testing.assert_array_equal(q.astype(np.float32), want)
    assert np.all(np.max(np.abs(q.astype(np.float32)), axis=1) == 448.0)


def test_all_zero_row_has_scale_one_and_zero_values() -> None:
    x = np.zeros((2, 8), np.float32)
    x[1] = 1.0
    for dt in ("i8", "f8e4m3"):
        q, s = quantize_rows(x, dtype=dt)
        assert s[0, 0] == 1.0 and np.all(q[0].astype(np.float32) == 0)


def test_int4_packing_by_hand() -> None:
    # one row, one group of 4 (as 2 groups of 2 for the packing): amax 7 -> scale 1
    w = np.array([[1.0, -8.0, 7.0, 0.0] * 16], np.float32)  # 64 inputs, one group
    packed, scales = quantize_weight_groups(w, 64)
    assert packed.shape == (1, 32) and scales.shape == (1, 1) and scales.dtype == np.float16
    assert scales[0, 0] == np.float16(8.0 / 7.0)  # amax 8 / 7
    q = np.rint(w / np.float32(scales[0, 0])).clip(-8, 7) + 8  # 1/1.14 -> 1, -7, 6, 0 -> 9, 1, 14, 8
    assert packed[0, 0] == int(q[0, 0]) | (int(q[0, 1]) << 4)
    assert packed[0, 1] == int(q[0, 2]) | (int(q[0, 3]) << 4)
    back = dequantize_groups(packed, scales, 64)
    assert np.max(np.abs(back - w)) <= float(scales[0, 0]) / 2 + 1e-6


def test_int4_round_trip_error_is_half_a_step_per_group() -> None:
    w = RNG.standard_normal((16, 256)).astype(np.float32)
    for g in (64, 128):
        packed, scales = quantize_weight_groups(w, g)
        back = dequantize_groups(packed, scales, g)
        step = np.repeat(scales.astype(np.float32), g, axis=1)
        assert np.all(np.abs(back - w) <= step * 0.5 + 1e-6 * step)


@pytest.mark.parametrize("dt", ["i8", "f8e4m3"])
def test_scaled_linear_is_the_product_of_dequantized_operands(dt: str) -> None:
    x, w = RNG.standard_normal((3, 7, 64)).astype(np.float32), RNG.standard_normal((24, 64)).astype(np.float32)
    bias = RNG.standard_normal(24).astype(np.float32)
    xq, xs = quantize_rows(x, dtype=dt)
    wq, ws = quantize_weight_rows(w, dt)
    got = scaled_linear(xq, xs, wq, ws, bias, out_dtype="f32")
    xd = xq.astype(np.float64) * xs
    wd = wq.astype(np.float64) * ws[:, None]
    np.testing.assert_allclose(got, xd @ wd.T + bias, rtol=1e-6, atol=1e-6)
    # and close to the unquantized product: per-row scales keep the error small
    exact = x.astype(np.float64) @ w.T + bias
    rel = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert rel < (0.01 if dt == "i8" else 0.05), rel


def test_int4_linear_rounds_weights_to_x_dtype() -> None:
    x = RNG.standard_normal((2, 128)).astype(ml_dtypes.bfloat16)
    w = RNG.standard_normal((8, 128)).astype(np.float32) * 0.1
    packed, scales = quantize_weight_groups(w, 64)
    got = int4_linear(x, packed, scales, group_size=64)
    wd = dequantize_groups(packed, scales, 64).astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_allclose(got, x.astype(np.float64) @ wd.T, rtol=1e-6, atol=1e-6)


def test_norm_modulate_quant_quantizes_the_stored_modulation() -> None:
    x = RNG.standard_normal((2, 5, 64)).astype(ml_dtypes.bfloat16)
    s = (RNG.standard_normal((2, 1, 64)) * 0.2).astype(ml_dtypes.bfloat16)
    t = (RNG.standard_normal((2, 1, 64)) * 0.2).astype(ml_dtypes.bfloat16)
    y = np.asarray(norm_modulate(x, s, t, kind="layer", eps=1e-6)).astype(ml_dtypes.bfloat16)
    q, sc = norm_modulate_quant(x, s, t, kind="layer", eps=1e-6, dtype="f8e4m3")
    q2, sc2 = quantize_rows(y, dtype="f8e4m3")
    np.testing.assert_array_equal(q.astype(np.float32), q2.astype(np.float32))
    np.testing.assert_array_equal(sc, sc2)


def _torch_fp8_attention(torch, q, k, v, mask, causal: bool):  # type: ignore[no-untyped-def]
    """sdpa_fp8's arithmetic written again in torch: float8_e4m3fn casts, torch's softmax pieces and matmuls."""
    f8 = torch.float8_e4m3fn

    def quant(x):  # type: ignore[no-untyped-def]
        s = (x.abs().max() / 448).clamp_min(1e-30)
        return (x / s).clamp(-448, 448).to(f8).float(), s

    (q8, sq), (k8, sk), (v8, sv) = (quant(torch.from_numpy(np.asarray(a, np.float32))) for a in (q, k, v))
    qh, kh, vh = (t.transpose(1, 2) for t in (q8 * sq, k8 * sk, v8))
    rep = qh.shape[1] // kh.shape[1]
    kh, vh = kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1)
    logits = qh @ kh.transpose(2, 3) / np.sqrt(q.shape[3])
    allowed = torch.ones(logits.shape[-2:], dtype=torch.bool)
    if causal:
        allowed = torch.tril(allowed)
    allowed = allowed[None, None] & (torch.from_numpy(mask)[:, None, None, :] if mask is not None else True)
    logits = logits.masked_fill(~allowed, float("-inf"))
    e = torch.exp(logits - logits.amax(-1, keepdim=True)).masked_fill(~allowed, 0)
    e8 = (e * 448).to(f8).float()
    out = (e8 @ vh) * (sv / 448) / e.sum(-1, keepdim=True)
    return ((out / sv).clamp(-448, 448).to(f8).float() * sv).transpose(1, 2).numpy()


@pytest.mark.parametrize("case", ["mha", "gqa-keymask", "causal"])
def test_sdpa_fp8_matches_the_same_arithmetic_in_torch(case: str) -> None:
    """The reference against torch's fp8 casts; and, as it must be, a few percent from exact attention."""
    torch = pytest.importorskip("torch")
    from dif.ops.attention import sdpa, sdpa_fp8

    hkv = 2 if case == "gqa-keymask" else 4
    q = RNG.standard_normal((2, 48, 4, 32)).astype(np.float32)
    k, v = (RNG.standard_normal((2, 48, hkv, 32)).astype(np.float32) for _ in range(2))
    mask = None
    if case == "gqa-keymask":
        mask = np.ones((2, 48), bool)
        mask[1, 30:] = False
    causal = case == "causal"
    got = sdpa_fp8(q, k, v, mask, scale=0.0, causal=causal)
    want = _torch_fp8_attention(torch, q, k, v, mask, causal)
    # the same roundings: only fp32 summation order differs, which can move a value across an e4m3 rounding
    # boundary; nearly all elements agree to fp32 precision
    close = np.isclose(got, want, rtol=1e-5, atol=1e-6)
    assert close.mean() > 0.995, f"{(~close).sum()} of {close.size} elements differ"
    exact = sdpa(q, k, v, mask, scale=0.0, causal=causal)
    err = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert 0.005 < err < 0.08, err  # fp8's error, neither absent nor gross


def _pair_tables(positions: int, width: int, *, zero_first: bool = False) -> tuple[np.ndarray, np.ndarray]:
    ang = RNG.uniform(-3, 3, (positions, width // 2))
    if zero_first:
        ang[0] = 0.0  # the first position unrotated: its values are the normalized ones
    return tuple(np.repeat(f(ang), 2, axis=1).astype(np.float32) for f in (np.cos, np.sin))  # type: ignore[return-value]


def _torch_norm_rope(torch, x, w, cos, sin, offset: float):  # type: ignore[no-untyped-def]
    """rms_norm_rope's value written again in torch: the RMS norm in fp32, rounded to x's dtype, pairs rotated."""
    t = torch.from_numpy(np.asarray(x, np.float32))
    n = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * (torch.from_numpy(np.asarray(w, np.float32)) + offset)
    n = n.to(torch.bfloat16).float()
    c, s = (torch.from_numpy(a)[None, :, None, :] for a in (cos, sin))
    rot = torch.stack([-n[..., 1::2], n[..., 0::2]], dim=-1).flatten(-2)
    return n * c + rot * s


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_rope_quant_bounds_every_value_and_matches_torch(offset: float) -> None:
    """The scale sqrt(D) * max|w + offset| / 448 is known before the tensor: no value of any row reaches past
    448 (a row whose energy sits in the channel of the largest weight comes within rounding of it), and the
    values are torch's float8_e4m3fn casts of the rotated rows at that scale."""
    torch = pytest.importorskip("torch")
    from dif.ops.quant import rms_norm_rope_quant

    d = 32
    w = (RNG.standard_normal(d) * 0.5 + (0.0 if offset else 1.0)).astype(np.float32)
    x = RNG.standard_normal((2, 6, 3, d)).astype(ml_dtypes.bfloat16)
    peak = int(np.argmax(np.abs(w + offset)))
    x[0, 0, 0] = 0
    x[0, 0, 0, peak] = 5.0  # all of the row's energy in one channel: sqrt(D) after the norm
    cos, sin = _pair_tables(6, d, zero_first=True)
    q, s = rms_norm_rope_quant(x, w, cos, sin, eps=1e-6, offset=offset, round_before_weight=False, mode="pairs",
                               dtype="f8e4m3")  # fmt: skip
    assert q.dtype == ml_dtypes.float8_e4m3fn and s.shape == (1,) and s.dtype == np.float32
    np.testing.assert_allclose(s[0], np.sqrt(d) * np.max(np.abs(w + offset)) / 448, rtol=1e-6)
    rotated = _torch_norm_rope(torch, x, w, cos, sin, offset)
    unsaturated = (rotated / float(s[0])).abs()
    assert float(unsaturated.max()) <= 448 * (1 + 2**-7)  # within bf16's rounding of the bound
    assert float(unsaturated[0, 0, 0].max()) > 440  # and the bound is reached
    want = (rotated / float(s[0])).clamp(-448, 448).to(torch.float8_e4m3fn).float().numpy()
    close = np.isclose(q.astype(np.float32), want, rtol=1e-6)
    assert close.mean() > 0.99, f"{(~close).sum()} of {close.size} differ"  # fp32 order moves a few across a rounding


def test_rms_norm_rope_quant_shares_one_scale_across_streams() -> None:
    """Two streams of one tensor, each with its own norm weight and the other's as its bound: the same scale,
    which the larger weight sets, and each stream's values within e4m3's half step of its rms_norm_rope."""
    from dif.ops.fused import rms_norm_rope
    from dif.ops.quant import rms_norm_rope_quant

    d = 16
    small, large = (np.full(d, v, ml_dtypes.bfloat16) + RNG.standard_normal(d).astype(ml_dtypes.bfloat16) * 0.1
                    for v in (0.5, 2.0))  # fmt: skip
    x = RNG.standard_normal((1, 4, 2, d)).astype(ml_dtypes.bfloat16)
    cos, sin = _pair_tables(4, d)
    attrs = {"eps": 1e-6, "offset": 0.0, "round_before_weight": False, "mode": "pairs"}
    (q0, s0), (q1, s1) = (rms_norm_rope_quant(x, w, cos, sin, b, **attrs, dtype="f8e4m3")
                          for w, b in ((small, large), (large, small)))  # fmt: skip
    largest = np.float32(np.max(np.abs(large.astype(np.float32))))
    assert s0[0] == s1[0] == np.float32(np.sqrt(np.float32(d)) * largest / np.float32(448))
    for q, w in ((q0, small), (q1, large)):
        exact = rms_norm_rope(x, w, cos, sin, **attrs)
        err = np.abs(q.astype(np.float32) * s0[0] - exact)
        assert np.all(err <= np.maximum(np.abs(exact) * 2**-4, s0[0] * 2**-9) * (1 + 1e-3))  # half a step of e4m3


def test_sdpa_fp8_qk_over_bounded_norms_is_within_fp8_error() -> None:
    """Attention over q, k quantized at the norms' bound against exact attention over the bf16 rms_norm_rope
    values: as close as sdpa_fp8 with per-tensor amax scales (the bound costs no precision), fp8's error."""
    from dif.ops.attention import sdpa, sdpa_fp8, sdpa_fp8_qk
    from dif.ops.fused import rms_norm_rope
    from dif.ops.quant import rms_norm_rope_quant

    d, attrs = 64, {"eps": 1e-6, "offset": 0.0, "round_before_weight": False, "mode": "pairs"}
    cos, sin = _pair_tables(48, d)
    xs = [RNG.standard_normal((2, 48, h, d)).astype(ml_dtypes.bfloat16) for h in (4, 2)]
    ws = [(1 + 0.3 * RNG.standard_normal(d)).astype(ml_dtypes.bfloat16) for _ in range(2)]
    v = RNG.standard_normal((2, 48, 2, d)).astype(ml_dtypes.bfloat16)
    q, k = (
        np.asarray(rms_norm_rope(x, w, cos, sin, **attrs)).astype(ml_dtypes.bfloat16)
        for x, w in zip(xs, ws, strict=True)
    )
    (q8, qs), (k8, ks) = (
        rms_norm_rope_quant(x, w, cos, sin, **attrs, dtype="f8e4m3") for x, w in zip(xs, ws, strict=True)
    )
    exact = sdpa(q, k, v, scale=0.0, causal=False)
    errs = [
        np.linalg.norm(got - exact) / np.linalg.norm(exact)
        for got in (sdpa_fp8_qk(q8, qs, k8, ks, v, scale=0.0, causal=False), sdpa_fp8(q, k, v, scale=0.0, causal=False))
    ]
    assert 0.005 < errs[0] < 0.08 and errs[0] < 1.5 * errs[1], errs
