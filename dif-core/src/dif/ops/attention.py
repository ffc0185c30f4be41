"""Attention: scaled dot-product attention (GQA, key-padding and causal masks) and rotary embeddings."""

from __future__ import annotations

import math

import numpy as np

from dif.dtypes import DType
from dif.ir.types import TensorType
from dif.ops._rules import fail, fp, need_float, need_rank, randn
from dif.ops.registry import AttrSpec, Case, defop


def _sdpa_infer(
    q: TensorType, k: TensorType, v: TensorType, key_mask: TensorType | None = None, *, scale: float, causal: bool
) -> TensorType:
    need_float(q)
    for t, what in ((q, "q"), (k, "k"), (v, "v")):
        need_rank(t, 4, what=f"{what} [B, S, H, D]")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise fail(f"q, k, v must share a dtype: {q}, {k}, {v}")
    b, sq, hq, d = q.shape
    if k.shape[0] != b or v.shape[0] != b or k.shape[3] != d:
        raise fail(f"k {k} does not match q {q} (batch or head dim)")
    if v.shape[1] != k.shape[1] or v.shape[2] != k.shape[2]:
        raise fail(f"v {v} must have k's sequence length and heads {k}")
    if k.shape[2] == 0 or hq % k.shape[2]:
        raise fail(f"{hq} query heads are not a multiple of {k.shape[2]} kv heads")
    if key_mask is not None and (key_mask.dtype != DType.BOOL or key_mask.shape != (b, k.shape[1])):
        raise fail(f"key_mask must be bool [{b}, {k.shape[1]}], got {key_mask}")
    if causal and sq > k.shape[1]:
        raise fail("causal attention needs Sq <= Skv")
    return TensorType((b, sq, hq, v.shape[3]), q.dtype)


def _sdpa_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if not dtype.is_float or dtype in (DType.F8E4M3, DType.F8E5M2):
        return []
    q = randn(rng, (2, 6, 4, 16), dtype)
    k = randn(rng, (2, 6, 2, 16), dtype)
    v = randn(rng, (2, 6, 2, 16), dtype)
    mask = np.ones((2, 6), bool)
    mask[1, 4:] = False
    kx, vx = randn(rng, (2, 9, 4, 16), dtype), randn(rng, (2, 9, 4, 8), dtype)
    return [
        Case("mha", (q, randn(rng, (2, 6, 4, 16), dtype), randn(rng, (2, 6, 4, 16), dtype))),
        Case("gqa", (q, k, v)),
        Case("gqa-keymask", (q, k, v, mask)),
        Case("causal-keymask", (q, k, v, mask), {"causal": True}),
        Case("cross-dv8-scale", (q, kx, vx), {"scale": 0.3}),
    ]


SDPA_OPERANDS = ("q", "k", "v", "key_mask?")
SDPA_ATTRS = (
    AttrSpec("scale", "float", 0.0, doc="softmax scale; 0 means 1/sqrt(head_dim)"),
    AttrSpec("causal", "bool", False, doc="query i sees keys j <= i + (Skv - Sq)"),
)


@defop(
    "sdpa",
    operands=SDPA_OPERANDS,
    attrs=SDPA_ATTRS,
    infer=_sdpa_infer,
    cases=_sdpa_cases,
    category="attention",
)
def sdpa(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, key_mask: np.ndarray | None = None, *, scale: float, causal: bool
) -> np.ndarray:
    """sdpa(q[B,Sq,Hq,D], k[B,Skv,Hkv,D], v[B,Skv,Hkv,Dv], key_mask?[B,Skv]; scale, causal) -> [B,Sq,Hq,Dv].

    softmax(q k^T * scale + mask) v per head in fp32. Grouped-query attention: query head h reads
    kv head h // (Hq / Hkv). key_mask is True where a key may be attended. A query row whose keys
    are all masked yields zeros (not NaN)."""
    e, denom, vf = unnormalized_attention(q, k, v, key_mask, scale=scale, causal=causal)
    e /= np.where(denom > 0, denom, 1)
    return np.swapaxes(np.matmul(e, vf), 1, 2)


def unnormalized_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, key_mask: np.ndarray | None, *, scale: float, causal: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(e [B, Hq, Sq, Skv], denom [B, Hq, Sq, 1], v [B, Hq, Skv, Dv]) in fp32: the softmax numerators
    exp(logit - row max) (0 where masked, so each lies in [0, 1]), their row sums and v with each query head's
    kv head, as `sdpa` (and `sdpa_fp8`, which rounds the numerators) multiply them: out = e / denom @ v."""
    # [B, H, S, D] layout so both products are batched BLAS matmuls
    qf, kf, vf = (np.swapaxes(fp(a), 1, 2) for a in (q, k, v))
    hq, hkv = q.shape[2], k.shape[2]
    if hkv != hq:
        kf = np.repeat(kf, hq // hkv, axis=1)
        vf = np.repeat(vf, hq // hkv, axis=1)
    s = scale or 1.0 / math.sqrt(q.shape[3])
    logits = np.matmul(qf * qf.dtype.type(s), np.swapaxes(kf, 2, 3))
    allowed = np.ones((1, 1, q.shape[1], k.shape[1]), bool)
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    if causal:
        offset = k.shape[1] - q.shape[1]
        allowed = allowed & (np.arange(k.shape[1])[None, :] <= np.arange(q.shape[1])[:, None] + offset)
    masked = key_mask is not None or causal
    if masked:
        logits = np.where(allowed, logits, -np.inf)
    peak = np.max(logits, axis=-1, keepdims=True)
    if masked:
        peak = np.where(np.isfinite(peak), peak, 0)
    e = np.exp(logits - peak, out=logits)
    if masked:
        e = np.where(allowed, e, 0)
    return e, e.sum(axis=-1, keepdims=True), vf


def _sdpa_fp8_infer(
    q: TensorType, k: TensorType, v: TensorType, key_mask: TensorType | None = None, *, scale: float, causal: bool
) -> TensorType:
    if q.dtype not in (DType.BF16, DType.F16):
        raise fail(f"q, k, v are quantized from f16 / bf16, got {q}")
    return _sdpa_infer(q, k, v, key_mask, scale=scale, causal=causal)


def _sdpa_fp8_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if dtype not in (DType.BF16, DType.F16):
        return []
    q, k, v = (randn(rng, (2, 64, h, 64), dtype) for h in (4, 2, 2))
    mask = np.ones((2, 64), bool)
    mask[1, 40:] = False
    return [
        Case("mha", (q, randn(rng, (2, 64, 4, 64), dtype), randn(rng, (2, 64, 4, 64), dtype, 3.0))),
        Case("gqa", (q, k, v)),
        Case("gqa-keymask", (q, k, v, mask)),
    ]


@defop(
    "sdpa_fp8",
    operands=SDPA_OPERANDS,
    attrs=SDPA_ATTRS,
    infer=_sdpa_fp8_infer,
    cases=_sdpa_fp8_cases,
    category="fused",
)
def sdpa_fp8(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, key_mask: np.ndarray | None = None, *, scale: float, causal: bool
) -> np.ndarray:
    """sdpa_fp8(q, k, v, key_mask?; scale, causal) -> sdpa's result over f16 / bf16 operands, with both matrix
    products in fp8-e4m3 (made by the format pass `quantize_fp8_attention`, `dif.passes.quantize`), as flash
    attention runs on fp8 matrix units with one scale per tensor:

    - q, k and v each quantized with its own scale s = amax / 448 (`tensor_scale`);
    - the logits (q k^T * scale, masked as in sdpa) and the softmax numerators e = exp(logit - row max) in
      fp32; e in [0, 1] is rounded to e4m3 at scale 1/448 for the second product, the row sums taken unrounded;
    - out = (e8 v8) * s_v / 448 / row sum, rounded to e4m3 at v's scale (an average of v's rows never exceeds
      its amax) and stored in q's dtype."""
    from dif.ops.quant import quantize_with, tensor_scale  # dif.ops.quant imports this module's users

    sq, sk = tensor_scale(q), tensor_scale(k)
    q8, k8 = quantize_with(q, sq, "f8e4m3"), quantize_with(k, sk, "f8e4m3")
    return fp8_attention(q8, sq, k8, sk, v, key_mask, scale=scale, causal=causal)


def fp8_attention(
    q8: np.ndarray, sq: np.float32, k8: np.ndarray, sk: np.float32, v: np.ndarray, key_mask: np.ndarray | None,
    *, scale: float, causal: bool,
) -> np.ndarray:  # fmt: skip
    """The fp8 flash attention of `sdpa_fp8` and `sdpa_fp8_qk` over e4m3 q8, k8 (each times its scale), v
    quantized with its own per-tensor scale; [B, Sq, Hq, Dv] fp32."""
    from dif.ops.quant import QMAX, quantize_with, tensor_scale

    sv = tensor_scale(v)
    v8 = quantize_with(v, sv, "f8e4m3").astype(np.float32)
    qf, kf = (x.astype(np.float32) * s for x, s in ((q8, sq), (k8, sk)))
    e, denom, vf = unnormalized_attention(qf, kf, v8, key_mask, scale=scale, causal=causal)
    qmax = np.float32(QMAX["f8e4m3"])
    e8 = quantize_with(e * qmax, np.float32(1.0), "f8e4m3").astype(np.float32)
    out = np.matmul(e8, vf) * (sv / qmax) / np.where(denom > 0, denom, 1)
    out8 = quantize_with(out, sv, "f8e4m3").astype(np.float32) * sv
    return np.swapaxes(out8, 1, 2)


def _sdpa_fp8_qk_infer(
    q8: TensorType, q_scale: TensorType, k8: TensorType, k_scale: TensorType, v: TensorType,
    key_mask: TensorType | None = None, *, scale: float, causal: bool,
) -> TensorType:  # fmt: skip
    for t, what in ((q8, "q"), (k8, "k")):
        if t.dtype != DType.F8E4M3:
            raise fail(f"{what} comes quantized to f8e4m3, got {t}")
    for t, what in ((q_scale, "q_scale"), (k_scale, "k_scale")):
        if t != TensorType((1,), DType.F32):
            raise fail(f"{what} is one f32 scale for the tensor, [1] f32, got {t}")
    if v.dtype not in (DType.BF16, DType.F16):
        raise fail(f"v is quantized from f16 / bf16, got {v}")
    as_v = (TensorType(t.shape, v.dtype) for t in (q8, k8))
    return _sdpa_infer(*as_v, v, key_mask, scale=scale, causal=causal)


def _sdpa_fp8_qk_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    from dif.ops.quant import quantize_with, tensor_scale

    if dtype not in (DType.BF16, DType.F16):
        return []

    def quantized(shape: tuple[int, ...], loose: float) -> tuple[np.ndarray, np.ndarray]:
        x = randn(rng, shape, DType.F32)  # a scale `loose` times amax / 448, as a bound known beforehand gives
        s = np.array([tensor_scale(x) * loose], np.float32)
        return quantize_with(x, s, "f8e4m3"), s

    (q8, qs), (k8, ks) = quantized((2, 64, 4, 64), 4.0), quantized((2, 64, 2, 64), 2.0)
    v = randn(rng, (2, 64, 2, 64), dtype, 3.0)
    mask = np.ones((2, 64), bool)
    mask[1, 40:] = False
    return [Case("gqa", (q8, qs, k8, ks, v)), Case("gqa-keymask", (q8, qs, k8, ks, v, mask))]


@defop(
    "sdpa_fp8_qk",
    operands=("q8", "q_scale", "k8", "k_scale", "v", "key_mask?"),
    attrs=SDPA_ATTRS,
    infer=_sdpa_fp8_qk_infer,
    cases=_sdpa_fp8_qk_cases,
    category="fused",
)
def sdpa_fp8_qk(
    q8: np.ndarray, q_scale: np.ndarray, k8: np.ndarray, k_scale: np.ndarray, v: np.ndarray,
    key_mask: np.ndarray | None = None, *, scale: float, causal: bool,
) -> np.ndarray:  # fmt: skip
    """sdpa_fp8_qk(q8, q_scale[1], k8, k_scale[1], v, key_mask?; scale, causal) -> [B, Sq, Hq, Dv] in v's dtype:
    `sdpa_fp8` with q and k quantized by their producers (`rms_norm_rope_quant`, whose scale is known before the
    tensor is computed), so no pass over them finds their amax: q = q8 * q_scale, k = k8 * k_scale; v, the
    softmax numerators and the output are quantized as in `sdpa_fp8` (made by `quantize_fp8_attention`,
    `dif.passes.quantize`)."""
    qs, ks = np.float32(q_scale.reshape(-1)[0]), np.float32(k_scale.reshape(-1)[0])
    return fp8_attention(q8, qs, k8, ks, v, key_mask, scale=scale, causal=causal)


def check_rope_tables(x: TensorType, cos: TensorType, sin: TensorType) -> None:
    """The part of the type rule that rope and the fused rms_norm_rope share: cos and sin both
    [S, R], S the sequence length of x [B, S, H, D], R even and at most the head dim."""
    if cos.shape != sin.shape or cos.rank != 2:
        raise fail(f"cos and sin must both be [S, R], got {cos} and {sin}")
    s, r = cos.shape
    if s != x.shape[1]:
        raise fail(f"table has {s} positions but x has sequence length {x.shape[1]}")
    if r > x.shape[3] or r % 2:
        raise fail(f"rotary width {r} must be even and <= head dim {x.shape[3]}")


def _rope_infer(x: TensorType, cos: TensorType, sin: TensorType, *, mode: str) -> TensorType:
    need_float(x, cos, sin)
    need_rank(x, 4, what="x [B, S, H, D]")
    check_rope_tables(x, cos, sin)
    return x


def rope_case_tables(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tables for the conformance cases of rope and rms_norm_rope (x [*, 5, *, 16]): one draw of
    (5, 8) angles laid out as (cos, sin) for mode "pairs" then for mode "half", each [5, 16] f32."""
    ang = rng.uniform(-3, 3, (5, 8))
    cos_p, sin_p = (np.repeat(f(ang), 2, axis=1).astype(np.float32) for f in (np.cos, np.sin))
    cos_h, sin_h = (np.concatenate([f(ang), f(ang)], axis=1).astype(np.float32) for f in (np.cos, np.sin))
    return cos_p, sin_p, cos_h, sin_h


def _rope_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if not dtype.is_float or dtype in (DType.F8E4M3, DType.F8E5M2):
        return []
    x = randn(rng, (2, 5, 3, 16), dtype)
    cos_p, sin_p, cos_h, sin_h = rope_case_tables(rng)
    return [
        Case("pairs-full", (x, cos_p, sin_p), {"mode": "pairs"}),
        Case("half-full", (x, cos_h, sin_h), {"mode": "half"}),
        Case("half-partial", (x, cos_h[:, :12], sin_h[:, :12]), {"mode": "half"}),
        Case("pairs-partial", (x, cos_p[:, :8], sin_p[:, :8]), {"mode": "pairs"}),
    ]


@defop(
    "rope",
    operands=("x", "cos", "sin"),
    attrs=(AttrSpec("mode", "str", "half", ("pairs", "half"), "pairs: interleaved (2i, 2i+1); half: rotate halves"),),
    infer=_rope_infer,
    cases=_rope_cases,
    category="attention",
)
def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, mode: str) -> np.ndarray:
    """rope(x[B,S,H,D], cos[S,R], sin[S,R]; mode): rotary embedding of the leading R channels of
    every head (the other D-R pass through), out = x*cos + rot(x)*sin in fp32.

    mode='pairs': rot(x)[2i] = -x[2i+1], rot(x)[2i+1] = x[2i]; cos/sin given per channel (each
    angle repeated twice). mode='half': rot(x) = concat(-x[R/2:R], x[:R/2]); cos/sin as [a | a]."""
    xf = fp(x)
    r = cos.shape[1]
    xr, rest = xf[..., :r], xf[..., r:]
    if mode == "pairs":
        even, odd = xr[..., 0::2], xr[..., 1::2]
        rot = np.stack([-odd, even], axis=-1).reshape(xr.shape)
    else:
        h = r // 2
        rot = np.concatenate([-xr[..., h:], xr[..., :h]], axis=-1)
    c = fp(cos)[None, :, None, :]
    s = fp(sin)[None, :, None, :]
    return np.concatenate([xr * c + rot * s, rest], axis=-1)


# -- the fused attention backward -------------------------------------------------------------------

FUSED_BACKWARD_DTYPES = (DType.F16, DType.BF16)
FUSED_BACKWARD_MAX_DIM = 256


def fused_backward_refusal(q: TensorType, k: TensorType, v: TensorType) -> str:
    """'' when `sdpa_backward` is defined for these operands, else why not: half precision, one head dim
    for q, k and v, a multiple of 8 up to 256 (the problems fused attention-backward kernels take)."""
    if q.dtype not in FUSED_BACKWARD_DTYPES:
        return f"dtype {q.dtype.value} (the fused backward is defined for f16 / bf16)"
    d = q.shape[3]
    if k.shape[3] != d or v.shape[3] != d or d % 8 or d > FUSED_BACKWARD_MAX_DIM:
        return f"head dims q/k {d}/{k.shape[3]}, v {v.shape[3]} (one head dim, a multiple of 8 up to 256)"
    return ""


def _stats_type(q: TensorType) -> TensorType:
    """The softmax statistics of attention over q [B, Sq, H, D]: log-sum-exp per (batch, head, query), fp32."""
    b, sq, hq, _d = q.shape
    return TensorType((b, hq, sq), DType.F32)


def _sdpa_backward_infer(
    q: TensorType, k: TensorType, v: TensorType, o: TensorType, do: TensorType, lse: TensorType | None = None,
    *, scale: float,
) -> tuple[TensorType, TensorType, TensorType]:  # fmt: skip
    _sdpa_infer(q, k, v, scale=scale, causal=False)
    for t, what in ((o, "o"), (do, "do")):
        if t != q:
            raise fail(f"{what} must have q's type {q} (the forward's output and its cotangent), got {t}")
    why = fused_backward_refusal(q, k, v)
    if why:
        raise fail(why)
    if lse is not None and lse != _stats_type(q):
        raise fail(f"lse must be the forward's statistics {_stats_type(q)}, got {lse}")
    return q, k, v


def _sdpa_backward_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    if dtype not in FUSED_BACKWARD_DTYPES:
        return []
    out = []
    for name, (b, sq, skv, hq, hkv, scale) in {
        "mha": (2, 6, 6, 4, 4, 0.0), "gqa": (2, 6, 6, 4, 2, 0.0), "cross-scale": (1, 5, 9, 2, 2, 0.3),
    }.items():  # fmt: skip
        q = randn(rng, (b, sq, hq, 16), dtype)
        k, v = randn(rng, (b, skv, hkv, 16), dtype), randn(rng, (b, skv, hkv, 16), dtype)
        o = sdpa(q, k, v, scale=scale, causal=False).astype(dtype.np)  # the forward's output, as stored
        out.append(Case(name, (q, k, v, o, randn(rng, (b, sq, hq, 16), dtype)), {"scale": scale}))
    q, k, v, o, do = out[1].operands  # gqa, with the forward's statistics given
    out.append(Case("gqa-stats", (q, k, v, o, do, sdpa_stats(q, k, v, scale=0.0)[1]), {"scale": 0.0}))
    return out


@defop(
    "sdpa_backward",
    operands=("q", "k", "v", "o", "do", "lse?"),
    attrs=(AttrSpec("scale", "float", 0.0, doc="the forward's softmax scale; 0 means 1/sqrt(head_dim)"),),
    infer=_sdpa_backward_infer,
    cases=_sdpa_backward_cases,
    category="fused",
    num_results=3,
)
def sdpa_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, do: np.ndarray, lse: np.ndarray | None = None,
    *, scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """sdpa_backward(q, k, v, o, do, lse?; scale) -> (dq, dk, dv): the gradients of an unmasked, non-causal
    `sdpa(q, k, v; scale)` whose output o received the cotangent do, computed in fp32 without storing the
    probabilities (as flash-attention backward kernels do). Autodiff emits it for half-precision attention
    (f16 / bf16, one head dim, a multiple of 8 up to 256); a backend that does not declare it runs the
    chain of core ops it stands for (`dif.passes.legalize`). lse [B, H, Sq] f32, the forward's softmax
    statistics (`sdpa_stats`, put in by the `reuse_attention_stats` pass), saves recomputing them; the
    result does not depend on it (P is the same softmax either way).

    P = softmax(q k^T s), dv = P^T do, dS = P (do v^T - rowsum(do o)), dq = dS k s, dk = dS^T q s, per head;
    a kv head's dk / dv sum over the query heads it serves. The row term reads the o given (the forward's
    stored output), as the fused kernels do."""
    qf, kf, vf, of, gf = (np.swapaxes(fp(a), 1, 2) for a in (q, k, v, o, do))  # [B, H, S, D]
    group = q.shape[2] // k.shape[2]
    kr, vr = (np.repeat(t, group, axis=1) for t in (kf, vf))
    s = scale or 1.0 / math.sqrt(q.shape[3])
    logits = np.matmul(qf * qf.dtype.type(s), np.swapaxes(kr, 2, 3))
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dv = np.matmul(np.swapaxes(p, 2, 3), gf)
    ds = p * (np.matmul(gf, np.swapaxes(vr, 2, 3)) - np.sum(gf * of, axis=-1, keepdims=True))
    dq = np.matmul(ds, kr) * s
    dk = np.matmul(np.swapaxes(ds, 2, 3), qf) * s

    def per_kv_head(t: np.ndarray) -> np.ndarray:
        b, h, n, d = t.shape
        return np.swapaxes(t.reshape(b, h // group, group, n, d).sum(axis=2), 1, 2)

    return np.swapaxes(dq, 1, 2), per_kv_head(dk), per_kv_head(dv)


def _sdpa_stats_infer(q: TensorType, k: TensorType, v: TensorType, *, scale: float) -> tuple[TensorType, TensorType]:
    out = _sdpa_infer(q, k, v, scale=scale, causal=False)
    why = fused_backward_refusal(q, k, v)
    if why:
        raise fail(why)
    return out, _stats_type(q)


def _sdpa_stats_cases(rng: np.random.Generator, dtype: DType) -> list[Case]:
    return [Case(c.name, c.operands[:3], c.attrs) for c in _sdpa_backward_cases(rng, dtype)[:3]]


@defop(
    "sdpa_stats",
    operands=("q", "k", "v"),
    attrs=(AttrSpec("scale", "float", 0.0, doc="softmax scale; 0 means 1/sqrt(head_dim)"),),
    infer=_sdpa_stats_infer,
    cases=_sdpa_stats_cases,
    category="fused",
    num_results=2,
)
def sdpa_stats(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """sdpa_stats(q, k, v; scale) -> (o, lse): an unmasked, non-causal `sdpa` that also returns its softmax
    statistics lse [B, H, Sq] f32 = log(sum_j exp(q_i . k_j s)), for the `sdpa_backward` of the same
    attention (the `reuse_attention_stats` pass puts it in, in a training step, so the backward does not
    recompute them). Half precision, the domain of `sdpa_backward`."""
    qf, kf = (np.swapaxes(fp(a), 1, 2) for a in (q, k))
    kr = np.repeat(kf, q.shape[2] // k.shape[2], axis=1)
    s = scale or 1.0 / math.sqrt(q.shape[3])
    logits = np.matmul(qf * qf.dtype.type(s), np.swapaxes(kr, 2, 3))
    peak = logits.max(axis=-1)
    lse = peak + np.log(np.exp(logits - peak[..., None]).sum(axis=-1))
    return sdpa(q, k, v, scale=scale, causal=False), lse
