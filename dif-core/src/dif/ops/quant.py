"""Quantized ops: what the format passes (`dif.passes.quantize`) put in place of `linear` and the producer of its
input when a physical format (fp8-e4m3 / int8 W8A8, int4-group weight-only; `dif.formats`) is chosen.

Frontends never emit these. Their references are exact definitions of the quantized arithmetic:

- symmetric per-row quantization: scale = amax(row) / QMAX (QMAX 448 for f8e4m3, 127 for i8; 1 for an
  all-zero row), q = x / scale in fp32, rounded to nearest even and saturated (fp8: clipped to +-448 then
  cast, as `cvt.rn.satfinite` does; i8: rint then clipped to +-127);
- W8A8 products: sum_k xq * wq accumulated exactly (float64 here: int8 sums stay far below 2^53, fp8 products
  are exact), times the row scale of x and the row (output channel) scale of w, plus bias, stored in the
  output dtype;
- int4 groups: weight row r, group g of `group_size` inputs has scale s[r, g] (f16) = amax / 7 and values
  q = clip(rint(w / s), -8, 7) stored as q + 8, two per byte (even input index in the low nibble); the GEMM
  uses w = (nibble - 8) * s rounded to x's dtype (what a kernel dequantizing into x-typed tiles multiplies).

Weight-side quantization happens once, at load (`quantize_weight_rows`, `quantize_weight_groups`: the
load-time transform `dif.weights.quantized` applies); activation scales are dynamic, per row, computed by the
kernel that produces the GEMM input (`norm_modulate_quant`, `rms_norm_modulate_quant`, `glu_quant`,
`concat_glu_quant`, `act_mul_quant`), or else by a pass of its own (`quantize_rows`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from dif.dtypes import FLOAT_DTYPES, DType
from dif.ir.types import TensorType
from dif.ops._rules import broadcast_shape, fail, fp, need_float, randn
from dif.ops.fused import (
    ACT_MUL_ACTS,
    RMS_NORM_MODULATE_ATTRS,
    RMS_NORM_ROPE_ATTRS,
    act_mul,
    norm_modulate,
    rms_norm_modulate,
    rms_norm_rope,
)
from dif.ops.norm import modulate_infer
from dif.ops.registry import AttrSpec, Case, defop, get_op

QUANT_DTYPES = ("f8e4m3", "i8")
"""Storage dtypes of W8A8 values: fp8 e4m3 (Hopper / Ada matrix units) and int8."""
QMAX = {"f8e4m3": 448.0, "i8": 127.0}
GROUP_SIZES = (32, 64, 128)
INT4_OFFSET = 8  # a stored nibble is q + 8, q in [-8, 7]
INT4_QMAX = 7.0


# -- the quantization arithmetic (shared by the references and the load-time weight transform) --------------


def row_scales(x: np.ndarray, dtype: str) -> np.ndarray:
    """[..., 1] f32 per-row scale of `x` [..., K]: amax / QMAX (1 for an all-zero row)."""
    amax = np.max(np.abs(x.astype(np.float32)), axis=-1, keepdims=True)
    scale = amax / np.float32(QMAX[dtype])
    return np.where(amax > 0, scale, np.float32(1.0)).astype(np.float32)


def quantize_with(x: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    """x / scale (fp32) rounded to nearest even and saturated, stored as `dtype` (f8e4m3 or i8)."""
    q = x.astype(np.float32) / scale.astype(np.float32)
    qmax = np.float32(QMAX[dtype])
    if dtype == "i8":
        return np.clip(np.rint(q), -qmax, qmax).astype(np.int8)
    return np.clip(q, -qmax, qmax).astype(ml_dtypes.float8_e4m3fn)


def quantize_weight_rows(w: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(wq [N, K] of `dtype`, ws [N] f32): weight `w` [N, K] quantized per output channel (load time)."""
    scale = row_scales(w, dtype)
    return quantize_with(w, scale, dtype), scale.reshape(w.shape[0])


def quantize_weight_groups(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed [N, K/2] u8, scales [N, K/group_size] f16): weight `w` [N, K] as int4 groups (load time).
    K must be a multiple of `group_size` (itself even)."""
    n, k = w.shape
    groups = w.astype(np.float32).reshape(n, k // group_size, group_size)
    amax = np.max(np.abs(groups), axis=-1)
    scales = np.where(amax > 0, amax / np.float32(INT4_QMAX), np.float32(1.0)).astype(np.float16)
    s = scales.astype(np.float32)[..., None]
    s = np.where(s > 0, s, np.float32(1.0))  # an f16 underflow to 0: the group quantizes to 0
    q = np.clip(np.rint(groups / s), -INT4_OFFSET, INT4_QMAX).astype(np.int16) + INT4_OFFSET
    q = q.reshape(n, k).astype(np.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8), scales


def dequantize_groups(packed: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """[N, K] f32 weights of int4 groups (`quantize_weight_groups`' inverse, up to the rounding)."""
    n = packed.shape[0]
    q = np.empty((n, packed.shape[1] * 2), dtype=np.float32)
    q[:, 0::2] = (packed & 0x0F).astype(np.float32) - INT4_OFFSET
    q[:, 1::2] = (packed >> 4).astype(np.float32) - INT4_OFFSET
    return q * np.repeat(scales.astype(np.float32), group_size, axis=1)


# -- quantize_rows ------------------------------------------------------------------------------------------


def _quantize_rows_infer(x: TensorType, *, dtype: str) -> tuple[TensorType, TensorType]:
    need_float(x)
    if x.rank < 1:
        raise fail(f"x must have rank >= 1, got {x}")
    return TensorType(x.shape, DType(dtype)), TensorType((*x.shape[:-1], 1), DType.F32)


def _float_inputs(dtype: DType) -> bool:
    return dtype in FLOAT_DTYPES and dtype not in (DType.F8E4M3, DType.F8E5M2)


def _quantize_rows_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if not _float_inputs(dtype):
        return []
    x = randn(rng, (3, 5, 64), dtype, 2.0)
    zero_row = randn(rng, (4, 32), dtype)
    zero_row[1] = 0
    return [Case(f"{shape}-{q}", (arr,), {"dtype": q}) for q in QUANT_DTYPES for shape, arr in
            (("3x5x64", x), ("4x32-zero-row", zero_row))]  # fmt: skip


@defop(
    "quantize_rows",
    operands=("x",),
    attrs=(AttrSpec("dtype", "dtype", choices=QUANT_DTYPES, doc="storage dtype of the values"),),
    infer=_quantize_rows_infer,
    cases=_quantize_rows_cases,
    category="fused",
    num_results=2,
)
def quantize_rows(x: np.ndarray, *, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """quantize_rows(x[..., K]; dtype) -> (q[..., K] of dtype, scale[..., 1] f32): symmetric dynamic per-row
    quantization, scale = amax(row) / QMAX (448 for f8e4m3, 127 for i8; 1 for an all-zero row),
    q = saturate(round_even(x / scale)) computed in fp32. x ~= q * scale."""
    return quantized_rows(x, dtype)


def quantized_rows(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(q, scale) of `x` per row: `quantize_rows`' arithmetic, typed as the pair it is."""
    scale = row_scales(x, dtype)
    return quantize_with(x, scale, dtype), scale


# -- norm_modulate_quant ------------------------------------------------------------------------------------


def _norm_modulate_quant_infer(
    x: TensorType, scale: TensorType, shift: TensorType, *, kind: str, eps: float, dtype: str
) -> tuple[TensorType, TensorType]:
    y = modulate_infer(x, scale, shift)
    return TensorType(y.shape, DType(dtype)), TensorType((*y.shape[:-1], 1), DType.F32)


def _norm_modulate_quant_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    # f32 only: at bf16 the norm's stored (rounded) value moves an amax by one bf16 ulp against a float64
    # evaluation, more than an f32 scale's tolerance; bf16 is checked per backend by its own tests.
    if dtype != DType.F32:
        return []
    out = []
    for kind in ("layer", "rms"):
        for q in QUANT_DTYPES:
            if q == "i8":  # i8 results compare exactly: one norm ulp apart on a backend is one quantum apart
                continue
            x = randn(rng, (2, 5, 64), dtype)
            s, t = randn(rng, (2, 1, 64), dtype, 0.3), randn(rng, (2, 1, 64), dtype, 0.3)
            out.append(Case(f"2x5x64-{kind}-{q}", (x, s, t), {"kind": kind, "eps": 1e-6, "dtype": q}))
    return out


@defop(
    "norm_modulate_quant",
    operands=("x", "scale", "shift"),
    attrs=(
        AttrSpec("kind", "str", choices=("layer", "rms"), doc="as in norm_modulate"),
        AttrSpec("eps", "float", doc="the norm's eps"),
        AttrSpec("dtype", "dtype", choices=QUANT_DTYPES, doc="storage dtype of the quantized values"),
    ),
    infer=_norm_modulate_quant_infer,
    cases=_norm_modulate_quant_cases,
    category="fused",
    num_results=2,
)
def norm_modulate_quant(
    x: np.ndarray, scale: np.ndarray, shift: np.ndarray, *, kind: str, eps: float, dtype: str
) -> tuple[np.ndarray, np.ndarray]:
    """norm_modulate_quant(x, scale, shift; kind, eps, dtype) -> (q, row_scale) = quantize_rows(
    norm_modulate(x, scale, shift; kind, eps); dtype), the modulated value rounded to x's dtype first, exactly
    as the unfused pair stores it: the producer of a W8A8 GEMM's input emits it quantized, with one scale per
    row (made by the format passes, `dif.passes.quantize`)."""
    y = np.asarray(norm_modulate(x, scale, shift, kind=kind, eps=eps)).astype(x.dtype)
    return quantized_rows(y, dtype)


# -- rms_norm_modulate_quant -------------------------------------------------------------------------------


def _rms_norm_modulate_quant_infer(
    x: TensorType, w: TensorType, scale: TensorType, shift: TensorType, *, eps: float, offset: float, dtype: str
) -> tuple[TensorType, TensorType]:
    y = get_op("rms_norm_modulate").infer(x, w, scale, shift, eps=eps, offset=offset)
    return TensorType(y.shape, DType(dtype)), TensorType((*y.shape[:-1], 1), DType.F32)


def _rms_norm_modulate_quant_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if dtype != DType.F32:  # as norm_modulate_quant
        return []
    x, w = randn(rng, (2, 5, 64), dtype), randn(rng, (64,), dtype, 0.3)
    s, t = randn(rng, (2, 1, 64), dtype, 0.3), randn(rng, (2, 1, 64), dtype, 0.3)
    return [Case(f"2x5x64-offset{offset:g}", (x, w, s, t), {"eps": 1e-5, "offset": offset, "dtype": "f8e4m3"})
            for offset in (0.0, 1.0)]  # fmt: skip


@defop(
    "rms_norm_modulate_quant",
    operands=("x", "w", "scale", "shift"),
    attrs=(
        *RMS_NORM_MODULATE_ATTRS,
        AttrSpec("dtype", "dtype", choices=QUANT_DTYPES, doc="storage dtype of the quantized values"),
    ),
    infer=_rms_norm_modulate_quant_infer,
    cases=_rms_norm_modulate_quant_cases,
    category="fused",
    num_results=2,
)
def rms_norm_modulate_quant(
    x: np.ndarray, w: np.ndarray, scale: np.ndarray, shift: np.ndarray, *, eps: float, offset: float, dtype: str
) -> tuple[np.ndarray, np.ndarray]:
    """rms_norm_modulate_quant(x, w, scale, shift; eps, offset, dtype) -> (q, row_scale) = quantize_rows(
    rms_norm_modulate(x, w, scale, shift; eps, offset); dtype), the norm's and the modulation's values each
    rounded to x's dtype, as the unfused ops store them: an adaptive norm whose RMS norm has a weight (Krea 2's
    blocks) emits the W8A8 GEMM's input in one pass (`dif.passes.quantize`)."""
    y = np.asarray(rms_norm_modulate(x, w, scale, shift, eps=eps, offset=offset)).astype(x.dtype)
    return quantized_rows(y, dtype)


# -- glu_quant ----------------------------------------------------------------------------------------------


def _glu_quant_infer(x: TensorType, *, act: str, gated_half: str, dtype: str) -> tuple[TensorType, TensorType]:
    need_float(x)
    if x.rank < 1 or x.shape[-1] % 2:
        raise fail(f"last axis must be even to split in halves, got {x}")
    shape = (*x.shape[:-1], x.shape[-1] // 2)
    return TensorType(shape, DType(dtype)), TensorType((*shape[:-1], 1), DType.F32)


def _glu_quant_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if dtype != DType.F32:  # as norm_modulate_quant: one rounding of the GLU apart on a backend moves an amax
        return []
    x = randn(rng, (2, 3, 128), dtype)
    return [Case(f"2x3x128-{act}-{half}", (x,), {"act": act, "gated_half": half, "dtype": "f8e4m3"})
            for act in ("silu", "gelu", "gelu_tanh") for half in ("first", "second")]  # fmt: skip


GLU_QUANT_ATTRS = (
    AttrSpec("act", "str", "silu", ("silu", "gelu", "gelu_tanh"), "as in glu"),
    AttrSpec("gated_half", "str", "first", ("first", "second"), "as in glu"),
    AttrSpec("dtype", "dtype", choices=QUANT_DTYPES, doc="storage dtype of the quantized values"),
)
"""The attributes of glu_quant and concat_glu_quant."""


@defop(
    "glu_quant",
    operands=("x",),
    attrs=GLU_QUANT_ATTRS,
    infer=_glu_quant_infer,
    cases=_glu_quant_cases,
    category="fused",
    num_results=2,
)
def glu_quant(x: np.ndarray, *, act: str, gated_half: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """glu_quant(x; act, gated_half, dtype) -> (q, row_scale) = quantize_rows(glu(x; act, gated_half); dtype),
    the GLU's value rounded to x's dtype first, as the unfused pair stores it: the feed-forward's gated
    activation emits the down projection's W8A8 input (made by the format passes, `dif.passes.quantize`)."""
    from dif.ops.norm import glu

    y = np.asarray(glu(x, act=act, gated_half=gated_half)).astype(x.dtype)
    return quantized_rows(y, dtype)


# -- concat_glu_quant ---------------------------------------------------------------------------------------


def _concat_glu_quant_infer(
    prefix: TensorType, x: TensorType, *, act: str, gated_half: str, dtype: str
) -> tuple[TensorType, TensorType]:
    need_float(prefix)
    glu_q, _ = _glu_quant_infer(x, act=act, gated_half=gated_half, dtype=dtype)
    if prefix.dtype != x.dtype or prefix.shape[:-1] != x.shape[:-1]:
        raise fail(f"prefix {prefix} must share x's dtype and leading shape, x is {x}")
    shape = (*x.shape[:-1], prefix.shape[-1] + glu_q.shape[-1])
    return TensorType(shape, DType(dtype)), TensorType((*shape[:-1], 1), DType.F32)


def _concat_glu_quant_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if dtype != DType.F32:  # as glu_quant
        return []
    prefix, x = randn(rng, (2, 3, 32), dtype, 2.0), randn(rng, (2, 3, 128), dtype)
    return [Case(f"2x3x(32+64)-{act}", (prefix, x), {"act": act, "gated_half": "first", "dtype": "f8e4m3"})
            for act in ("silu", "gelu_tanh")]  # fmt: skip


@defop(
    "concat_glu_quant",
    operands=("prefix", "x"),
    attrs=GLU_QUANT_ATTRS,
    infer=_concat_glu_quant_infer,
    cases=_concat_glu_quant_cases,
    category="fused",
    num_results=2,
)
def concat_glu_quant(
    prefix: np.ndarray, x: np.ndarray, *, act: str, gated_half: str, dtype: str
) -> tuple[np.ndarray, np.ndarray]:
    """concat_glu_quant(prefix, x; act, gated_half, dtype) -> (q, row_scale) = quantize_rows(concat(prefix,
    glu(x; act, gated_half), axis=-1); dtype), the GLU's value rounded to x's dtype first: a parallel DiT block's
    output projection reads its attention output beside its MLP's gated activation (FLUX.2's single blocks), and
    one kernel quantizes the two together, so the activation is never written unquantized (`dif.passes.quantize`)."""
    from dif.ops.norm import glu

    y = np.asarray(glu(x, act=act, gated_half=gated_half)).astype(x.dtype)
    return quantized_rows(np.concatenate([np.asarray(prefix), y], axis=-1), dtype)


# -- scaled_linear ------------------------------------------------------------------------------------------


def _scaled_linear_infer(
    xq: TensorType,
    xs: TensorType,
    wq: TensorType,
    ws: TensorType,
    bias: TensorType | None = None,
    *,
    out_dtype: str,
) -> TensorType:
    if xq.dtype.value not in QUANT_DTYPES or wq.dtype != xq.dtype:
        raise fail(f"xq and wq must share one of {', '.join(QUANT_DTYPES)}, got {xq} and {wq}")
    if wq.rank != 2 or xq.rank < 1 or xq.shape[-1] != wq.shape[1]:
        raise fail(f"weight must be [out, in] and xq [..., in]; got xq {xq}, wq {wq}")
    if xs.dtype != DType.F32 or xs.shape != (*xq.shape[:-1], 1):
        raise fail(f"xs must be f32{[*xq.shape[:-1], 1]}, got {xs}")
    if ws.dtype != DType.F32 or ws.shape != (wq.shape[0],):
        raise fail(f"ws must be f32[{wq.shape[0]}], got {ws}")
    out = DType(out_dtype)
    if bias is not None and (bias.shape != (wq.shape[0],) or bias.dtype != out):
        raise fail(f"bias must be {out.value}[{wq.shape[0]}], got {bias}")
    return TensorType((*xq.shape[:-1], wq.shape[0]), out)


def _scaled_linear_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if not _float_inputs(dtype):
        return []
    out = []
    for q in QUANT_DTYPES:
        x, w = randn(rng, (2, 5, 64), DType.F32), randn(rng, (24, 64), DType.F32, 0.2)
        xq, xs = quantize_rows(x, dtype=q)
        wq, ws = quantize_weight_rows(w, q)
        bias = randn(rng, (24,), dtype)
        out.append(Case(f"2x5x64-{q}-bias", (xq, xs, wq, ws, bias), {"out_dtype": dtype.value}))
        out.append(Case(f"2x5x64-{q}", (xq, xs, wq, ws), {"out_dtype": dtype.value}))
    return out


@defop(
    "scaled_linear",
    operands=("xq", "xs", "wq", "ws", "bias?"),
    attrs=(AttrSpec("out_dtype", "dtype", choices=("f32", "bf16", "f16"), doc="the result's dtype"),),
    infer=_scaled_linear_infer,
    cases=_scaled_linear_cases,
    category="fused",
)
def scaled_linear(
    xq: np.ndarray,
    xs: np.ndarray,
    wq: np.ndarray,
    ws: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    out_dtype: str,
) -> np.ndarray:
    """scaled_linear(xq[..., in], xs[..., 1], wq[out, in], ws[out], bias?[out]; out_dtype) -> [..., out]
    = (xq @ wq^T) * xs * ws + bias: a W8A8 GEMM (xq, wq both f8e4m3 or both i8), the per-row activation scale
    and per-output-channel weight scale applied in the epilogue, the result stored as out_dtype (made by the
    format passes, `dif.passes.quantize`). The products accumulate exactly here; int8 matrix units do too
    (int32), fp8 ones keep about 14 bits (`dif.testing.tolerances.FP8_ACCUMULATION`)."""
    acc = xq.astype(np.float64) @ wq.astype(np.float64).T
    y = acc * xs.astype(np.float64) * ws.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y.astype(np.float32)


# -- scaled_linear_gated_residual ---------------------------------------------------------------------------


def _scaled_linear_gated_residual_infer(
    x: TensorType,
    gate: TensorType,
    xq: TensorType,
    xs: TensorType,
    wq: TensorType,
    ws: TensorType,
    bias: TensorType | None = None,
) -> TensorType:
    need_float(x)
    y = _scaled_linear_infer(xq, xs, wq, ws, bias, out_dtype=x.dtype.value)
    if x != y:
        raise fail(f"the residual x {x} must have the product's type {y}")
    if gate.dtype != x.dtype or broadcast_shape(gate.shape, y.shape) != y.shape:
        raise fail(f"the gate {gate} must be of x's dtype and broadcast to {y}")
    return y


def _scaled_linear_gated_residual_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if not _float_inputs(dtype):
        return []
    out = []
    x, r = randn(rng, (2, 5, 64), DType.F32), randn(rng, (2, 5, 24), dtype)
    wq_ws = {q: quantize_weight_rows(randn(rng, (24, 64), DType.F32, 0.2), q) for q in QUANT_DTYPES}
    gates = {"one-gate": randn(rng, (1, 1, 24), dtype), "gate-per-batch": randn(rng, (2, 1, 24), dtype)}
    for q in QUANT_DTYPES:
        xq, xs = quantize_rows(x, dtype=q)
        for name, gate in gates.items():
            out.append(Case(f"2x5x64-{q}-{name}", (r, gate, xq, xs, *wq_ws[q])))
        bias = randn(rng, (24,), dtype)
        out.append(Case(f"2x5x64-{q}-one-gate-bias", (r, gates["one-gate"], xq, xs, *wq_ws[q], bias)))
    return out


@defop(
    "scaled_linear_gated_residual",
    operands=("x", "gate", "xq", "xs", "wq", "ws", "bias?"),
    infer=_scaled_linear_gated_residual_infer,
    cases=_scaled_linear_gated_residual_cases,
    category="fused",
)
def scaled_linear_gated_residual(
    x: np.ndarray,
    gate: np.ndarray,
    xq: np.ndarray,
    xs: np.ndarray,
    wq: np.ndarray,
    ws: np.ndarray,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """scaled_linear_gated_residual(x[..., out], gate, xq, xs, wq, ws, bias?) -> [..., out]
    = x + gate * scaled_linear(xq, xs, wq, ws, bias), the gate broadcast to x: a DiT block's gated residual
    (`gated_residual(x, gate, scaled_linear(..))`) with the W8A8 GEMM's product unrounded, as an epilogue that
    takes the gate into the output-channel scales and x as the GEMM's C computes it (made by the W8A8 passes,
    `dif.passes.quantize`); stored in x's dtype."""
    y = scaled_linear(xq, xs, wq, ws, bias, out_dtype=DType.F32.value)
    return (fp(x) + fp(gate) * y).astype(np.float32)


# -- sdpa_fp8 -----------------------------------------------------------------------------------------------


def tensor_scale(x: np.ndarray, dtype: str = "f8e4m3") -> np.float32:
    """The per-tensor scale of `x`: amax(x) / QMAX (1 for an all-zero tensor)."""
    return np.float32(row_scales(np.reshape(x, (1, -1)), dtype)[0, 0])


# -- rms_norm_rope_quant ------------------------------------------------------------------------------------

MAX_SHARED_NORMS = 4
"""The most norm weights one scale of `rms_norm_rope_quant` is bounded over (w and its `bound` operands): the
parts of an attention's q or k, as FLUX.2's text and image streams make them, each normalized by its own."""


def norm_bound_scale(weights: tuple[np.ndarray, ...], offset: float, dim: int, dtype: str) -> np.float32:
    """sqrt(dim) * m / QMAX (1 when m is 0), m the largest |w + offset| over `weights`, in f32: no channel of a
    row RMS-normalized over `dim` channels and then weighted by one of them exceeds sqrt(dim) * m, nor does a
    rotation of its pairs, so that scale quantizes every such value without saturating it."""
    m = max(float(np.max(np.abs(w.astype(np.float32) + np.float32(offset)))) for w in weights)
    if m == 0:
        return np.float32(1.0)
    return np.float32(np.sqrt(np.float32(dim)) * np.float32(m) / np.float32(QMAX[dtype]))


def _rms_norm_rope_quant_infer(
    x: TensorType, w: TensorType, cos: TensorType, sin: TensorType, *bound: TensorType, eps: float, offset: float,
    round_before_weight: bool, mode: str, dtype: str,
) -> tuple[TensorType, TensorType]:  # fmt: skip
    if x.dtype not in (DType.BF16, DType.F16):
        raise fail(f"x is quantized from f16 / bf16, got {x}")
    get_op("rms_norm_rope").infer(x, w, cos, sin, eps=eps, offset=offset, round_before_weight=round_before_weight,
                                  mode=mode)  # fmt: skip
    if len(bound) > MAX_SHARED_NORMS - 1:
        raise fail(f"one scale is bounded over at most {MAX_SHARED_NORMS} norm weights, got {1 + len(bound)}")
    for b in bound:
        if b != w:
            raise fail(f"a bound weight must be typed as w {w}, got {b}")
    return TensorType(x.shape, DType(dtype)), TensorType((1,), DType.F32)


def _rms_norm_rope_quant_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    from dif.ops.attention import rope_case_tables

    if dtype not in (DType.BF16, DType.F16):
        return []
    x = randn(rng, (2, 5, 3, 16), dtype, 2.0)
    w, other = ((1 + randn(rng, (16,), DType.F32, 0.3)).astype(dtype.np) for _ in range(2))
    f32w = randn(rng, (16,), DType.F32, 0.2)
    cos_p, sin_p, cos_h, sin_h = rope_case_tables(rng)
    q = {"dtype": "f8e4m3"}
    return [
        Case("pairs", (x, w, cos_p, sin_p), {**q, "mode": "pairs"}),
        Case("pairs-shared-scale", (x, w, cos_p, sin_p, other), {**q, "mode": "pairs"}),
        Case("half-partial-qwen", (x, w, cos_h[:, :12], sin_h[:, :12]),
             {**q, "mode": "half", "round_before_weight": True}),
        Case("pairs-f32-weight-offset", (x, f32w, cos_p, sin_p), {**q, "mode": "pairs", "offset": 1.0}),
    ]  # fmt: skip


@defop(
    "rms_norm_rope_quant",
    operands=("x", "w", "cos", "sin", "bound*"),
    attrs=(*RMS_NORM_ROPE_ATTRS, AttrSpec("dtype", "dtype", choices=("f8e4m3",), doc="storage dtype of the values")),
    infer=_rms_norm_rope_quant_infer,
    cases=_rms_norm_rope_quant_cases,
    category="fused",
    num_results=2,
)
def rms_norm_rope_quant(
    x: np.ndarray, w: np.ndarray, cos: np.ndarray, sin: np.ndarray, *bound: np.ndarray, eps: float, offset: float,
    round_before_weight: bool, mode: str, dtype: str,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """rms_norm_rope_quant(x, w, cos, sin, bound*; eps, offset, round_before_weight, mode, dtype) -> (q, scale[1]):
    rms_norm_rope's value (normalized and rounded to x's dtype, then rotated, in fp32), quantized with one scale
    for the tensor known before it is computed, `norm_bound_scale` over w and the `bound` weights (the norms of
    the other parts of the tensor the scale serves: FLUX.2's text stream beside its image stream), which no value
    exceeds (the offset added to every bound weight too). An attention's q and k as `sdpa_fp8_qk` reads them, with
    no pass to find their amax (made by `quantize_fp8_attention`, `dif.passes.quantize`)."""
    rotated = rms_norm_rope(x, w, cos, sin, eps=eps, offset=offset, round_before_weight=round_before_weight, mode=mode)
    s = norm_bound_scale((w, *bound), offset, x.shape[-1], dtype)
    return quantize_with(rotated, s, dtype), np.array([s], np.float32)


# -- int4_linear --------------------------------------------------------------------------------------------


def _int4_linear_infer(
    x: TensorType, wq: TensorType, ws: TensorType, bias: TensorType | None = None, *, group_size: int
) -> TensorType:
    need_float(x)
    k = x.shape[-1] if x.rank else 0
    if wq.dtype != DType.U8 or wq.rank != 2 or wq.shape[1] * 2 != k:
        raise fail(f"wq must be u8[out, {k // 2}] (two 4-bit values per byte), got {wq} for x {x}")
    if k % group_size:
        raise fail(f"x's {k} input features are not a multiple of group_size {group_size}")
    if ws.dtype != DType.F16 or ws.shape != (wq.shape[0], k // group_size):
        raise fail(f"ws must be f16[{wq.shape[0]}, {k // group_size}], got {ws}")
    if bias is not None and (bias.shape != (wq.shape[0],) or bias.dtype != x.dtype):
        raise fail(f"bias must be {x.dtype.value}[{wq.shape[0]}], got {bias}")
    return TensorType((*x.shape[:-1], wq.shape[0]), x.dtype)


def _int4_linear_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if not _float_inputs(dtype):
        return []
    out = []
    for g in GROUP_SIZES:  # 32: a GGUF Q4_0 file's blocks (`dif.weights.gguf_int4`)
        x, w = randn(rng, (3, 4, 256), dtype), randn(rng, (40, 256), DType.F32, 0.1)
        wq, ws = quantize_weight_groups(w, g)
        out.append(Case(f"3x4x256-g{g}", (x, wq, ws), {"group_size": g}))
        out.append(Case(f"3x4x256-g{g}-bias", (x, wq, ws, randn(rng, (40,), dtype)), {"group_size": g}))
    return out


@defop(
    "int4_linear",
    operands=("x", "wq", "ws", "bias?"),
    attrs=(AttrSpec("group_size", "int", choices=GROUP_SIZES, doc="inputs per scale"),),
    infer=_int4_linear_infer,
    cases=_int4_linear_cases,
    category="fused",
)
def int4_linear(
    x: np.ndarray, wq: np.ndarray, ws: np.ndarray, bias: np.ndarray | None = None, *, group_size: int
) -> np.ndarray:
    """int4_linear(x[..., in], wq[out, in/2] u8, ws[out, in/group_size] f16, bias?[out]; group_size) -> [..., out]
    = x @ w^T + bias with w[r, k] = (nibble(r, k) - 8) * ws[r, k // group_size] rounded to x's dtype; nibble k
    of row r is the low half of byte k/2 for even k, the high half for odd k. Weight-only: x stays in its
    dtype; fp32 accumulation (made by the format passes, `dif.passes.quantize`)."""
    w = fp(dequantize_groups(wq, ws, group_size).astype(x.dtype))  # the weight as linear would read it
    y = fp(x) @ w.T
    if bias is not None:
        y = y + fp(bias)
    return y


# -- act_mul_quant ------------------------------------------------------------------------------------------


def _act_mul_quant_infer(g: TensorType, u: TensorType, *, act: str, dtype: str) -> tuple[TensorType, TensorType]:
    need_float(g)
    if g != u:
        raise fail(f"the gate g {g} and the value u {u} must share one type")
    return TensorType(g.shape, DType(dtype)), TensorType((*g.shape[:-1], 1), DType.F32)


def _act_mul_quant_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if dtype != DType.F32:  # as glu_quant
        return []
    g, u = randn(rng, (2, 3, 128), dtype, 2.0), randn(rng, (2, 3, 128), dtype)
    return [Case(f"2x3x128-{act}", (g, u), {"act": act, "dtype": "f8e4m3"}) for act in ACT_MUL_ACTS]


@defop(
    "act_mul_quant",
    operands=("g", "u"),
    attrs=(
        AttrSpec("act", "str", "silu", ACT_MUL_ACTS, "applied to g"),
        AttrSpec("dtype", "dtype", choices=QUANT_DTYPES, doc="storage dtype of the quantized values"),
    ),
    infer=_act_mul_quant_infer,
    cases=_act_mul_quant_cases,
    category="fused",
    num_results=2,
)
def act_mul_quant(g: np.ndarray, u: np.ndarray, *, act: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """act_mul_quant(g, u; act, dtype) -> (q, row_scale) = quantize_rows(act_mul(g, u; act); dtype), the activation
    and the product each rounded to g's dtype, as the unfused act and mul store them: a gate computed apart from
    its value (Krea 2's SwiGLU, silu(gate) * up, and its attention gate, attention * sigmoid(gate)) emits the next
    W8A8 GEMM's input in one pass (`dif.passes.quantize`), neither product written unquantized."""
    return quantized_rows(act_mul(g, u, act=act).astype(g.dtype), dtype)
