"""The quantized ops on the GPU (marker `cuda`) against the numpy references of dif.ops.quant, at the shapes of a
DiT block: the fused norm + modulate (and GLU) + per-row quantization, fp8-e4m3 and int8 W8A8 GEMMs on cuBLASLt (and
the portable tile GEMM), int8 in several row blocks, int4 groups dequantized in the GEMM, and a whole tiny
FLUX.2 denoiser through the format passes against the CPU backend. Skips with the reason without a GPU; the
profile's fp8 / int8 matrix units are required where the format needs them."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from dif.dtypes import DType
from dif.ops.attention import sdpa_fp8
from dif.ops.quant import (
    act_mul_quant,
    concat_glu_quant,
    glu_quant,
    int4_linear,
    norm_modulate_quant,
    quantize_rows,
    quantize_weight_groups,
    quantize_weight_rows,
    rms_norm_modulate_quant,
    scaled_linear,
    scaled_linear_gated_residual,
)

from .conftest import cuda_skip_reason

pytestmark = pytest.mark.cuda

_BACKENDS: dict[str, Any] = {}
BF16 = ml_dtypes.bfloat16


def backend(variant: str = "default") -> Any:
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    if variant not in _BACKENDS:
        from dif_backend_cuda.device import CudaBackend

        options = {"portable": {"gemm": "nvrtc"}, "mma": {"int4": "mma"}, "tile": {"int4": "tile"},
                   "registers": {"rows": "registers"}, "staged": {"rows": "staged"}}.get(variant, {})  # fmt: skip
        _BACKENDS[variant] = CudaBackend(**options)
    return _BACKENDS[variant]


def needs_units(be: Any, fmt: str) -> None:
    if fmt not in be.profile().tensor_core_formats:
        pytest.skip(f"this GPU has no {fmt} matrix units ({be.profile().arch})")


def run_one(be: Any, op: str, operands: list[np.ndarray], **attrs: Any) -> tuple[list[np.ndarray], dict[int, str]]:
    """One-node program over `operands` as inputs, prepared and run on `be`: (results, the lowering's choices)."""
    from dif.testing.conformance import run_one_node

    results, exe = run_one_node(be, op, operands, **attrs)
    return results, dict(getattr(exe, "choices", {}))


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))


RNG = np.random.default_rng(11)


@pytest.mark.parametrize("rows", ["staged", "registers"])
@pytest.mark.parametrize("q", ["f8e4m3", "i8"])
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("width", [3072, 4104])
def test_norm_modulate_quant_bf16_at_a_dit_row(q: str, kind: str, rows: str, width: int) -> None:
    """Each row kernel (DIF_CUDA_ROWS) against the reference: staged in shared memory, a warp per row (3,072
    wide, klein 4B's) and a block per row in registers (4,104: not 256 * N, no whole chunk per thread)."""
    be = backend(rows)
    if q == "f8e4m3":
        needs_units(be, "fp8-e4m3")
    x = RNG.standard_normal((1, 600, width)).astype(BF16)
    s, t = (
        (RNG.standard_normal((1, 1, width)) * 0.3).astype(BF16),
        (RNG.standard_normal((1, 1, width)) * 0.3).astype(BF16),
    )
    from dif.testing.conformance import run_one_node

    (gq, gs), exe = run_one_node(be, "norm_modulate_quant", [x, s, t], kind=kind, eps=1e-6, dtype=q)
    wq, ws = norm_modulate_quant(x, s, t, kind=kind, eps=1e-6, dtype=q)
    np.testing.assert_allclose(gs, ws, rtol=1e-2)  # the amax of bf16 values: at most one bf16 ulp apart
    deq_got, deq_want = gq.astype(np.float32) * gs, wq.astype(np.float32) * ws
    assert rel(deq_got, deq_want) < (2e-3 if q == "i8" else 2e-2)
    same = np.mean(gq.astype(np.float32) == wq.astype(np.float32))
    assert same > 0.99, f"only {same:.4f} of the quantized values equal the reference"
    (step,) = exe.steps
    family = "staged" if rows == "staged" else ("warp12" if width == 3072 else "vec")
    assert {"warp12": "_warp12_", "vec": "_vec_"}.get(family, "norm_modulate_quant_bf16") in step.name, step.name


@pytest.mark.parametrize("rows", ["staged", "registers"])
@pytest.mark.parametrize(("weight", "q"), [("f32", "f8e4m3"), ("bf16", "f8e4m3"), ("f32", "i8")])
def test_rms_norm_modulate_quant_bf16_at_a_krea2_row(weight: str, q: str, rows: str) -> None:
    """Krea 2's adaptive norm (6,144 wide, its weight pinned to f32 or in bf16, offset 1) against the reference,
    in each row kernel."""
    be = backend(rows)
    if q == "f8e4m3":
        needs_units(be, "fp8-e4m3")
    width = 6144
    x = RNG.standard_normal((1, 400, width)).astype(BF16)
    w = (RNG.standard_normal(width) * 0.2).astype(np.float32 if weight == "f32" else BF16)
    s, t = ((RNG.standard_normal((1, 1, width)) * 0.3).astype(BF16) for _ in range(2))
    from dif.testing.conformance import run_one_node

    attrs = {"eps": 1e-5, "offset": 1.0, "dtype": q}
    (gq, gs), exe = run_one_node(be, "rms_norm_modulate_quant", [x, w, s, t], **attrs)
    wq, ws = rms_norm_modulate_quant(x, w, s, t, **attrs)
    np.testing.assert_allclose(gs, ws, rtol=1e-2)
    assert rel(gq.astype(np.float32) * gs, wq.astype(np.float32) * ws) < (2e-3 if q == "i8" else 2e-2)
    assert np.mean(gq.astype(np.float32) == wq.astype(np.float32)) > 0.99
    (step,) = exe.steps
    assert step.name.endswith(f"bf16_{weight}_{q}") and ("_vec_" in step.name) == (rows == "registers"), step.name


@pytest.mark.parametrize("rows", ["staged", "registers"])
@pytest.mark.parametrize("q", ["f8e4m3", "i8"])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_glu_quant_bf16_at_a_feed_forward_row(q: str, act: str, rows: str) -> None:
    be = backend(rows)
    if q == "f8e4m3":
        needs_units(be, "fp8-e4m3")
    x = RNG.standard_normal((1, 300, 2 * 9216)).astype(BF16)
    from dif.testing.conformance import run_one_node

    (gq, gs), exe = run_one_node(be, "glu_quant", [x], act=act, gated_half="first", dtype=q)
    wq, ws = glu_quant(x, act=act, gated_half="first", dtype=q)
    np.testing.assert_allclose(gs, ws, rtol=1e-2)
    assert rel(gq.astype(np.float32) * gs, wq.astype(np.float32) * ws) < (2e-3 if q == "i8" else 2e-2)
    assert np.mean(gq.astype(np.float32) == wq.astype(np.float32)) > 0.99
    (step,) = exe.steps
    assert ("_vec_" in step.name) == (rows == "registers"), step.name


@pytest.mark.parametrize("rows", ["staged", "registers"])
@pytest.mark.parametrize("half", ["first", "second"])
def test_concat_glu_quant_bf16_at_a_single_block_row(half: str, rows: str) -> None:
    """klein 9B's single-block output projection input: 4,096 attention values beside a 12,288-wide GLU, one
    scale over both (the attention half scaled up so its amax decides some rows, the GLU's others)."""
    be = backend(rows)
    needs_units(be, "fp8-e4m3")
    attn = (RNG.standard_normal((1, 200, 4096)) * RNG.choice([0.5, 4.0], (1, 200, 1))).astype(BF16)
    x = RNG.standard_normal((1, 200, 2 * 12288)).astype(BF16)
    from dif.testing.conformance import run_one_node

    attrs = {"act": "silu", "gated_half": half, "dtype": "f8e4m3"}
    (gq, gs), exe = run_one_node(be, "concat_glu_quant", [attn, x], **attrs)
    wq, ws = concat_glu_quant(attn, x, **attrs)
    assert gq.shape == (1, 200, 4096 + 12288) and gs.shape == (1, 200, 1)
    np.testing.assert_allclose(gs, ws, rtol=1e-2)
    assert rel(gq.astype(np.float32) * gs, wq.astype(np.float32) * ws) < 2e-2
    assert np.mean(gq.astype(np.float32) == wq.astype(np.float32)) > 0.99
    (step,) = exe.steps
    assert ("_vec_" in step.name) == (rows == "registers"), step.name


@pytest.mark.parametrize("rows", ["staged", "registers"])
@pytest.mark.parametrize(("act", "width", "q"), [("silu", 16384, "f8e4m3"), ("sigmoid", 6144, "f8e4m3"),
                                                 ("silu", 6144, "i8")])  # fmt: skip
def test_act_mul_quant_bf16_at_a_krea2_row(act: str, width: int, q: str, rows: str) -> None:
    """Krea 2's SwiGLU (silu(gate) * up, 16,384 wide) and attention gate (sigmoid, 6,144) against the reference,
    in each row kernel."""
    be = backend(rows)
    if q == "f8e4m3":
        needs_units(be, "fp8-e4m3")
    g = (RNG.standard_normal((1, 300, width)) * 2).astype(BF16)
    u = RNG.standard_normal((1, 300, width)).astype(BF16)
    from dif.testing.conformance import run_one_node

    (gq, gs), exe = run_one_node(be, "act_mul_quant", [g, u], act=act, dtype=q)
    wq, ws = act_mul_quant(g, u, act=act, dtype=q)
    np.testing.assert_allclose(gs, ws, rtol=1e-2)
    assert rel(gq.astype(np.float32) * gs, wq.astype(np.float32) * ws) < (2e-3 if q == "i8" else 2e-2)
    assert np.mean(gq.astype(np.float32) == wq.astype(np.float32)) > 0.99
    (step,) = exe.steps
    assert ("_vec_" in step.name) == (rows == "registers"), step.name


@pytest.mark.parametrize("variant", ["default", "portable"])
@pytest.mark.parametrize("q, fmt", [("f8e4m3", "fp8-e4m3"), ("i8", "int8")])
def test_scaled_linear_bf16_out(variant: str, q: str, fmt: str) -> None:
    be = backend(variant)
    needs_units(be, fmt)
    rows, k, out = 640, 1024, 1536
    x = RNG.standard_normal((1, rows, k)).astype(np.float32)
    w = (RNG.standard_normal((out, k)) / 32).astype(np.float32)
    bias = (RNG.standard_normal(out) * 0.1).astype(BF16)
    xq, xs = quantize_rows(x, dtype=q)
    wq, ws = quantize_weight_rows(w, q)
    (got,), choices = run_one(be, "scaled_linear", [xq, xs, wq, ws, bias], out_dtype="bf16")
    want = scaled_linear(xq, xs, wq, ws, bias, out_dtype="bf16").astype(BF16)
    assert got.dtype == BF16
    assert rel(got, want) < 8e-3, choices
    if variant == "default" and "nvmath" in be.profile().libraries:
        assert any(c.startswith("cublaslt") for c in choices.values()), choices


@pytest.mark.parametrize("variant", ["default", "portable"])
@pytest.mark.parametrize("gate_rows, bias", [(1, True), (1, False), (2, False)])
def test_scaled_linear_gated_residual_at_a_dit_row(variant: str, gate_rows: int, bias: bool) -> None:
    """x + gate * the fp8 GEMM: with one gate for every row, the gate in the GEMM's output-channel scales (and
    bias) and x as its C, one cuBLASLt call after `gate_channels`; a gate per batch row, or the portable GEMM,
    the GEMM and then the gated residual in place. Each against the reference, whose product is unrounded."""
    be = backend(variant)
    needs_units(be, "fp8-e4m3")
    rows, k, out = 320, 1024, 1536
    x = RNG.standard_normal((2, rows, k)).astype(np.float32)
    w = (RNG.standard_normal((out, k)) / 32).astype(np.float32)
    r = RNG.standard_normal((2, rows, out)).astype(BF16)
    gate = (RNG.standard_normal((gate_rows, 1, out)) * 0.5).astype(BF16)
    xq, xs = quantize_rows(x, dtype="f8e4m3")
    wq, ws = quantize_weight_rows(w, "f8e4m3")
    extra = [(RNG.standard_normal(out) * 0.1).astype(BF16)] if bias else []
    (got,), choices = run_one(be, "scaled_linear_gated_residual", [r, gate, xq, xs, wq, ws, *extra])
    want = scaled_linear_gated_residual(r, gate, xq, xs, wq, ws, *extra)
    assert got.dtype == BF16
    assert rel(got, want) < 8e-3, choices
    (choice,) = choices.values()
    fused = variant == "default" and gate_rows == 1 and "nvmath" in be.profile().libraries
    assert ("the residual as C" in choice) == fused, choice


def test_int8_in_several_row_blocks() -> None:
    """4608 rows x 4096 outputs of int32 need more than the 64 MiB scratch: two blocks, one epilogue each."""
    be = backend()
    needs_units(be, "int8")
    rows, k, out = 4608, 512, 4096
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    w = (RNG.standard_normal((out, k)) / 16).astype(np.float32)
    xq, xs = quantize_rows(x, dtype="i8")
    wq, ws = quantize_weight_rows(w, "i8")
    (got,), choices = run_one(be, "scaled_linear", [xq, xs, wq, ws], out_dtype="bf16")
    want = scaled_linear(xq, xs, wq, ws, out_dtype="bf16")
    assert rel(got, want) < 8e-3, choices
    if "nvmath" in be.profile().libraries:
        assert any("2 row block(s)" in c for c in choices.values()), choices
    np.testing.assert_allclose(got[-1].astype(np.float32), want[-1], rtol=3e-2, atol=3e-2)  # the last block too


@pytest.mark.parametrize("kernel", ["tile", "mma"])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_int4_linear(group: int, dtype: str, kernel: str) -> None:
    """Rows and outputs that fill no whole 128 x 128 tile, with and without bias, on either kernel
    (DIF_CUDA_INT4): with `mma`, bf16 / f16 on the tensor-core kernel (sm_80+) and f32 on the tile GEMM."""
    be = backend(kernel)
    np_dtype = DType(dtype).np
    rows, k, out = 300, 1024, 808
    x = RNG.standard_normal((1, rows, k)).astype(np_dtype)
    w = (RNG.standard_normal((out, k)) / 32).astype(np.float32)
    wq, ws = quantize_weight_groups(w, group)
    bias = (RNG.standard_normal(out) * 0.1).astype(np_dtype)
    for operands in ([x, wq, ws, bias], [x, wq, ws]):
        (got,), choices = run_one(be, "int4_linear", operands, group_size=group)
        want = int4_linear(*operands, group_size=group).astype(np_dtype)
        assert rel(got, want) < (8e-3 if dtype == "bf16" else 2e-3), choices
    (choice,) = choices.values()
    mma = kernel == "mma" and dtype != "f32" and be.props["major"] >= 8
    assert choice.startswith("nvrtc int4 tensor-core GEMM") == mma, choice


@pytest.mark.parametrize("rows", ["staged", "registers"])
def test_quantize_rows_exact_int8(rows: str) -> None:
    be = backend(rows)
    x = RNG.standard_normal((257, 16384)).astype(BF16)  # klein 9B's single-block concat: 1,024 threads of 2 chunks
    (q, s), _ = run_one(be, "quantize_rows", [x], dtype="i8")
    wq, ws = quantize_rows(x, dtype="i8")
    np.testing.assert_array_equal(q, wq)
    np.testing.assert_array_equal(s, ws)


@pytest.mark.parametrize("pass_name, fmt", [("quantize_fp8", "fp8-e4m3"), ("quantize_int8", "int8"),
                                            ("quantize_int4", "int4-group"),
                                            ("quantize_fp8_attention", "fp8-e4m3")])  # fmt: skip
def test_tiny_flux2_denoiser_through_a_format_pass_matches_the_cpu(pass_name: str, fmt: str) -> None:
    be = backend()
    if fmt != "int4-group":
        needs_units(be, fmt)
    from dif.runtime import prepare
    from dif.testing.random_checkpoint import name_rng, random_weight
    from dif_frontend_flux2 import DEFAULT_CHECKPOINT
    from dif_frontend_flux2.config import load_configs
    from dif_frontend_flux2.model import build_transformer

    cfg = load_configs(DEFAULT_CHECKPOINT).transformer
    program = build_transformer(cfg, batch=1, n_img=64, n_txt=16, dtype=DType.BF16)
    weights = {p.name: random_weight(name_rng(p.name), p.name, p.type.shape).astype(p.type.dtype.np)
               for p in program.params}  # fmt: skip
    rng = np.random.default_rng(5)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in program.inputs}
    passes = ("rope_before_concat", "fuse_norm_rope", "fuse_norm_modulate", "fuse_gated_residual", pass_name)
    cpu, _ = prepare(program, weights, "cpu", passes=passes)
    gpu, plan = prepare(program, weights, be, passes=passes)
    assert any(d.what.startswith(f"{pass_name}: applied") for d in plan.decisions)
    if pass_name == "quantize_fp8_attention":  # the attention on cuDNN's fp8 path, not a fallback
        assert any("fp8-e4m3" in c for c in gpu.choices.values()), gpu.choices
    want = next(iter(cpu.run(inputs).values()))
    got = next(iter(gpu.run(inputs).values()))
    assert rel(got, want) < 2e-2


def test_concat_glu_quant_reads_a_fused_projection_in_place() -> None:
    """concat(attention part, glu(MLP part)) of one fused projection in fp8: planned on the GPU, the split's parts
    are pitched views (no copy) that `concat_glu_quant` reads by their row pitch; the result is the CPU's."""
    be = backend()
    needs_units(be, "fp8-e4m3")
    from dif.runtime import prepare

    from .programs import parallel_projection_input

    program = parallel_projection_input()
    weights = {p.name: (RNG.standard_normal(p.type.shape) / 16).astype(BF16) for p in program.params}
    inputs = {v.name: RNG.standard_normal(v.type.shape).astype(BF16) for v in program.inputs}
    cpu, _ = prepare(program, weights, "cpu", passes=("quantize_fp8",))
    gpu, _ = prepare(program, weights, be, passes=("quantize_fp8",))
    names = [getattr(step, "name", step.kind) for step in gpu.steps]
    assert "glu_quant_vec_silu_bf16_f8e4m3" in names and not any("copy" in n for n in names), names
    want = next(iter(cpu.run(inputs).values()))
    got = next(iter(gpu.run(inputs).values()))
    assert rel(got, want) < 2e-2


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("heads, tokens", [((8, 8), 256), ((8, 2), 300)])
def test_sdpa_fp8_matches_the_reference(dtype: str, heads: tuple[int, int], tokens: int) -> None:
    """cuDNN's fp8 attention between the quantization kernels against dif.ops.attention.sdpa_fp8: the same
    roundings, summed in another order (a flash kernel's running max and tiles)."""
    be = backend()
    needs_units(be, "fp8-e4m3")
    from dif.ops.attention import sdpa

    np_dt = BF16 if dtype == "bf16" else np.float16
    hq, hkv = heads
    q = RNG.standard_normal((1, tokens, hq, 128)).astype(np_dt)
    k, v = (RNG.standard_normal((1, tokens, hkv, 128)).astype(np_dt) for _ in range(2))
    (got,), choices = run_one(be, "sdpa_fp8", [q, k, v], scale=0.0, causal=False)
    assert "fp8-e4m3" in choices[0], choices
    want = sdpa_fp8(q, k, v, scale=0.0, causal=False)
    exact = sdpa(q, k, v, scale=0.0, causal=False)
    assert rel(got, want) < 0.03, rel(got, want)
    assert rel(got, exact) > 0.005  # it did round to fp8


def test_sdpa_fp8_with_a_key_mask_matches_the_reference() -> None:
    """Krea 2's masked text keys: the attended keys' e4m3 rows gathered first, cuDNN's padding mask over them."""
    be = backend()
    needs_units(be, "fp8-e4m3")
    q, k, v = (RNG.standard_normal((2, 320, 4, 128)).astype(BF16) for _ in range(3))
    mask = np.ones((2, 320), bool)
    mask[0, 200:260] = False  # a masked run inside the keys
    mask[1, 70:] = False
    (got,), choices = run_one(be, "sdpa_fp8", [q, k, v, mask], scale=0.0, causal=False)
    assert "fp8-e4m3" in choices[0] and "gathered first" in choices[0], choices
    assert rel(got, sdpa_fp8(q, k, v, mask, scale=0.0, causal=False)) < 0.03


def _pair_tables(tokens: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    ang = RNG.uniform(-3, 3, (tokens, width // 2))
    return tuple(np.repeat(f(ang), 2, axis=1).astype(np.float32) for f in (np.cos, np.sin))  # type: ignore[return-value]


@pytest.mark.parametrize("heads, dim, wdt, offset", [
    (24, 128, "bf16", 0.0),  # klein: 8 heads a warp
    (12, 128, "f32", 1.0),  # Krea 2's k (f32 weights, zero-centred): 4 heads a warp
    (3, 64, "bf16", 0.0),  # the warp-per-row kernel
])  # fmt: skip
def test_rms_norm_rope_quant_matches_the_reference(heads: int, dim: int, wdt: str, offset: float) -> None:
    """The e4m3 values and the scale the norm weights bound (with another stream's weight sharing it) against
    dif.ops.quant.rms_norm_rope_quant: the scale exactly, the values but for an fp32 rounding's step."""
    be = backend()
    needs_units(be, "fp8-e4m3")
    from dif.ops.quant import rms_norm_rope_quant

    x = (RNG.standard_normal((1, 96, heads, dim)) * 3).astype(BF16)
    wt = BF16 if wdt == "bf16" else np.float32
    w, other = ((RNG.standard_normal(dim) * 0.3 + (0.0 if offset else 1.0)).astype(wt) for _ in range(2))
    cos, sin = _pair_tables(96, dim)
    attrs = {"eps": 1e-6, "offset": offset, "round_before_weight": False, "mode": "pairs", "dtype": "f8e4m3"}
    (q, s), choices = run_one(be, "rms_norm_rope_quant", [x, w, cos, sin, other], **attrs)
    want_q, want_s = rms_norm_rope_quant(x, w, cos, sin, other, **attrs)
    assert s.tolist() == want_s.tolist()
    got, want = (np.asarray(a).astype(np.float32) for a in (q, want_q))
    assert np.mean(got == want) > 0.99 and np.all(np.abs(got - want) <= np.abs(want) * 0.125 + 2**-9)


@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_fp8_qk_matches_the_reference(masked: bool) -> None:
    """cuDNN's fp8 attention over q and k quantized by their norms (v quantized by the passes alone) against
    dif.ops.attention.sdpa_fp8_qk; with Krea 2's masked keys the given keys are gathered with v's copy."""
    be = backend()
    needs_units(be, "fp8-e4m3")
    from dif.ops.attention import sdpa_fp8_qk
    from dif.ops.quant import rms_norm_rope_quant

    cos, sin = _pair_tables(320, 128)
    attrs = {"eps": 1e-6, "offset": 0.0, "round_before_weight": False, "mode": "pairs", "dtype": "f8e4m3"}
    (q8, qs), (k8, ks) = (
        rms_norm_rope_quant(RNG.standard_normal((2, 320, h, 128)).astype(BF16),
                            (1 + 0.3 * RNG.standard_normal(128)).astype(BF16), cos, sin, **attrs)
        for h in (8, 2)
    )  # fmt: skip
    v = RNG.standard_normal((2, 320, 2, 128)).astype(BF16)
    mask = np.ones((2, 320), bool)
    mask[0, 200:260] = False
    mask[1, 70:] = False
    operands = [q8, qs, k8, ks, v, *([mask] if masked else [])]
    (got,), choices = run_one(be, "sdpa_fp8_qk", operands, scale=0.0, causal=False)
    assert "q and k quantized by their norms" in choices[0], choices
    assert rel(got, sdpa_fp8_qk(*operands, scale=0.0, causal=False)) < 0.03


def test_sdpa_fp8_cudnn_cannot_run_falls_back_to_the_run_dtype_saying_why() -> None:
    be = backend()
    from dif.ops.attention import sdpa

    q, k, v = (RNG.standard_normal((1, 64, 2, 72)).astype(BF16) for _ in range(3))
    (got,), choices = run_one(be, "sdpa_fp8", [q, k, v], scale=0.0, causal=False)
    assert "in bf16, not fp8: head dims q/k 72" in choices[0], choices
    assert rel(got, sdpa(q, k, v, scale=0.0, causal=False)) < 1e-2
