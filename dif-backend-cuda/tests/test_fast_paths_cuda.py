"""The vectorized kernels at the sizes transformer blocks use (marker `cuda`), against the reference
interpreter: the 16-byte elementwise paths (unary, same-shape binary, row modulate), norm_modulate with a
warp per row (or 16 values per thread), q/k norm + RoPE with 8 or 4 heads per warp, the GLU with 8 per
thread, cuDNN attention with a key mask, attention with a 512-wide head (a VAE's mid block: cuBLASLt
steps, or the wide flash kernel), the cuDNN convolution with and without bias (and in the large workspace),
2-D transposes in tiles, few long reductions split across warps and the portable convolution's split-K."""

from __future__ import annotations

import numpy as np
import pytest

from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plan.planner import plan_program

from .conftest import cuda_skip_reason

pytestmark = pytest.mark.cuda


def _run(
    program: Program, tol: float, given: dict[str, np.ndarray] | None = None, seen: list[str] | None = None,
    **options: str,
) -> list[str]:  # fmt: skip
    """Run `program` on the GPU against the interpreter (inputs random unless `given`); returns the names of
    the kernels it launched (a library step by its kind); `seen` gets the lowering's choices."""
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    from dif_backend_cuda.device import CudaBackend

    backend = CudaBackend(**options)
    rng = np.random.default_rng(3)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in program.inputs}
    inputs.update(given or {})
    want = interpret(program, inputs, {})[program.outputs[0]].astype(np.float64)
    exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), {})
    got = exe.run(inputs)[program.outputs[0]].astype(np.float64)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel <= tol, f"rel-L2 {rel:.2e}"
    if seen is not None:
        seen.extend(exe.choices.values())
    return [getattr(step, "name", step.kind) for step in exe.steps]


@pytest.mark.parametrize(
    ("dtype", "length", "batch", "kernel"),
    [
        ("bf16", 4096, 1, "norm_modulate_warp16_bf16"),  # klein 9B
        ("bf16", 3072, 2, "norm_modulate_warp12_bf16"),  # klein 4B, a scale row per batch row
        ("f16", 1024, 1, "norm_modulate_warp4_f16"),
        ("f32", 3072, 2, "norm_modulate_warp24_f32"),
        ("bf16", 4352, 1, "norm_modulate_vec16_bf16"),  # 17 chunks per lane: no warp kernel
    ],
)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_modulate_long_rows(kind: str, dtype: str, length: int, batch: int, kernel: str) -> None:
    b = ProgramBuilder("norm_modulate")
    x = b.input("x", (batch, 96, length), dtype)
    s, t = b.input("s", (batch, 1, length), dtype), b.input("t", (batch, 1, length), dtype)
    b.output(b.emit("norm_modulate", x, s, t, kind=kind, eps=1e-6))
    assert _run(b.build(), 1e-2 if dtype != "f32" else 1e-5) == [kernel]


@pytest.mark.parametrize(
    ("wdt", "length", "kernel"),
    [
        ("f32", 6144, "rms_norm_modulate_warp24_bf16_f32"),  # Krea 2: the weight pinned to fp32
        ("bf16", 4096, "rms_norm_modulate_warp16_bf16_bf16"),
        ("f32", 4352, "rms_norm_modulate_vec16_bf16_f32"),
        ("f32", 100, "rms_norm_modulate_bf16_f32"),
    ],
)
def test_rms_norm_modulate_weights_norm_modulates_kernels(wdt: str, length: int, kernel: str) -> None:
    """Krea 2's adaptive norm (offset 1) in each of norm_modulate's kernels, weighted, against the interpreter."""
    b = ProgramBuilder("rms_norm_modulate")
    x = b.input("x", (1, 96, length), "bf16")
    w = b.input("w", (length,), wdt)
    s, t = b.input("s", (1, 1, length), "bf16"), b.input("t", (1, 1, length), "bf16")
    b.output(b.emit("rms_norm_modulate", x, w, s, t, eps=1e-5, offset=1.0))
    assert _run(b.build(), 1e-2) == [kernel]


@pytest.mark.parametrize(("act", "n"), [("silu", 4608 * 16384 // 64), ("sigmoid", 1001)])
def test_act_mul_in_16_byte_chunks_or_by_element(act: str, n: int) -> None:
    b = ProgramBuilder("act_mul")
    g, u = b.input("g", (n,), "bf16"), b.input("u", (n,), "bf16")
    b.output(b.emit("act_mul", g, u, act=act))
    assert _run(b.build(), 1e-2) == [f"act_mul_vec_{act}_bf16" if n % 8 == 0 else f"act_mul_{act}_bf16"]


@pytest.mark.parametrize(("dtype", "tol"), [("bf16", 1e-2), ("f32", 1e-5)])
def test_group_norm_in_slices(dtype: str, tol: float) -> None:
    """A VAE-sized group (8 channels x 64x64 here: 8 slices of 4096) takes the two-pass slice kernels; values
    far from zero check that the slices' means and M2 combine without cancellation."""
    b = ProgramBuilder("group_norm")
    x = b.input("x", (1, 64, 64, 64), dtype)
    w, bias = b.input("w", (64,), dtype), b.input("b", (64,), dtype)
    b.output(b.emit("group_norm", x, w, bias, groups=8, eps=1e-6))
    rng = np.random.default_rng(5)
    offset = rng.standard_normal((1, 64, 1, 1)) * 4 + 20  # per-channel means around 20
    given = {"x": (rng.standard_normal((1, 64, 64, 64)) + offset).astype(x.dtype.np)}
    kernels = _run(b.build(), tol, given)
    assert kernels == [f"group_norm_stats_{dtype}", f"group_norm_apply_{dtype}_{dtype}"]


@pytest.mark.parametrize(("dtype", "shape", "kernel"), [
    ("bf16", (1, 3, 5, 8), "upsample2x_u16"),
    ("f32", (2, 4, 3, 12), "upsample2x_u32"),
    ("bf16", (1, 2, 3, 6), None),  # rows of 6: no 4-value loads, the strided copy
])  # fmt: skip
def test_upsample_nearest_twice(dtype: str, shape: tuple[int, ...], kernel: str | None) -> None:
    b = ProgramBuilder("upsample")
    b.output(b.emit("upsample_nearest", b.input("x", shape, dtype), scale=2))
    kernels = _run(b.build(), 0.0)  # a copy: exact
    assert kernels == [kernel] if kernel else not any(k.startswith("upsample2x") for k in kernels)


@pytest.mark.parametrize(("dtype", "shape", "perm", "kernel"), [
    ("f32", (3, 70, 45), (0, 2, 1), "transpose_tile_u32"),  # batched, edges of partial tiles
    ("bf16", (130, 257), (1, 0), "transpose_tile_u16"),  # a weight's transpose (a linear's backward)
    ("f16", (2, 3, 40, 33), (0, 1, 3, 2), "transpose_tile_u16"),  # attention's P^T: batch and heads merged
    ("f32", (2, 5, 7, 8), (0, 2, 1, 3), None),  # rows stay contiguous: the strided copy
])  # fmt: skip
def test_transpose_of_the_last_two_axes_in_tiles(dtype: str, shape: tuple[int, ...], perm: tuple[int, ...],
                                                 kernel: str | None) -> None:  # fmt: skip
    b = ProgramBuilder("transpose")
    b.output(b.emit("transpose", b.input("x", shape, dtype), perm=perm))
    kernels = _run(b.build(), 0.0)  # a copy: exact
    assert kernels == [kernel] if kernel else not any(k.startswith("transpose_tile") for k in kernels)


@pytest.mark.parametrize(("op", "dtype", "shape", "axes", "tol"), [
    ("reduce_sum", "f32", (300, 2000), (0, 1), 1e-5),  # a loss or a squared norm: one output
    ("reduce_mean", "f16", (3, 50000), (1,), 2e-3),
    ("reduce_max", "bf16", (2, 70000), (1,), 0.0),
    ("reduce_sum", "f32", (4096, 16), (0, 1), 1e-5),  # a LoRA factor's squared norm
])  # fmt: skip
def test_few_long_reductions_split_across_warps(op: str, dtype: str, shape: tuple[int, ...], axes: tuple[int, ...],
                                                tol: float) -> None:  # fmt: skip
    b = ProgramBuilder("reduce")
    b.output(b.emit(op, b.input("x", shape, dtype), axes=axes))
    kind = "max" if op == "reduce_max" else "sum"
    kernels = _run(b.build(), tol)
    assert kernels == [f"reduce_partial_{kind}_{dtype}", f"reduce_finish_{kind}_{dtype}"]


@pytest.mark.parametrize(("dtype", "bias", "tol"), [("f32", True, 1e-5), ("f32", False, 1e-5), ("bf16", True, 1e-2)])
def test_weight_gradient_shaped_convolution_splits_its_reduction(dtype: str, bias: bool, tol: float) -> None:
    """conv2d as autodiff writes a weight gradient (the batch as channels, the output gradient as a 64x64
    kernel, 3x3 outputs, dilation 2): two output tiles over 16*64*64 terms, split over K (kernels/conv.cu)."""
    b = ProgramBuilder("wgrad")
    x, g = b.input("x", (8, 16, 130, 130), dtype), b.input("g", (8, 16, 64, 64), dtype)
    extra = [b.input("bias", (8,), dtype)] if bias else []
    b.output(b.emit("conv2d", x, g, *extra, padding=(0, 0, 0, 0), stride=(1, 1), dilation=(2, 2), groups=1))
    seen: list[str] = []
    kernels = _run(b.build(), tol, seen=seen, gemm="nvrtc")
    assert kernels == [f"conv2d_split_{dtype}", f"conv2d_finish_{dtype}"]
    assert any("split over K in" in c for c in seen), seen


@pytest.mark.parametrize(("heads", "per_warp"), [(16, 8), (12, 4)])
@pytest.mark.parametrize("mode", ["pairs", "half"])
def test_rms_norm_rope_heads_per_warp(heads: int, per_warp: int, mode: str) -> None:
    b = ProgramBuilder("rms_norm_rope")
    x = b.input("x", (2, 24, heads, 128), "bf16")
    w = b.input("w", (128,), "bf16")
    cos, sin = b.input("cos", (24, 128), "f32"), b.input("sin", (24, 128), "f32")
    b.output(b.emit("rms_norm_rope", x, w, cos, sin, mode=mode))
    assert _run(b.build(), 1e-2) == [f"rms_norm_rope_vec{per_warp}_bf16_bf16_f32"]


@pytest.mark.parametrize(
    ("op", "shapes", "dtype", "attrs", "kernel"),
    [
        ("silu", [(2, 40, 1536)], "bf16", {}, "unary_vec_silu_bf16"),
        ("sigmoid", [(3, 256)], "f32", {}, "unary_vec_sigmoid_f32"),
        ("mul", [(2, 40, 1536), (2, 40, 1536)], "bf16", {}, "binary_vec_mul_bf16"),
        ("modulate", [(2, 40, 6144), (2, 1, 6144), (2, 1, 6144)], "bf16", {}, "modulate_rows_bf16"),
    ],
)
def test_elementwise_fast_paths(op: str, shapes: list[tuple[int, ...]], dtype: str, attrs: dict, kernel: str) -> None:
    b = ProgramBuilder(op)
    ins = [b.input(f"in{i}", shape, dtype) for i, shape in enumerate(shapes)]
    b.output(b.emit(op, *ins, **attrs))
    assert _run(b.build(), 1e-2 if dtype != "f32" else 1e-5) == [kernel]


ATTENDED_KEYS_FIRST = ["sdpa_key_order", "sdpa_gather_keys_16b", "cudnn", "sdpa_zero_masked_rows_{dt}"]
SCORE_BIAS = ["sdpa_mask_bias_{dt}", "cudnn", "sdpa_zero_masked_rows_{dt}"]


@pytest.mark.parametrize(
    ("causal", "dtype", "heads", "kernels"),
    [
        (False, "bf16", (4, 4), ATTENDED_KEYS_FIRST),  # cuDNN's padding mask over the attended keys
        (False, "f16", (8, 2), ATTENDED_KEYS_FIRST),  # grouped-query heads, as Krea 2's
        (True, "bf16", (4, 4), SCORE_BIAS),  # causal: the keys keep their order
    ],
)
def test_key_mask_runs_through_cudnn(causal: bool, dtype: str, heads: tuple[int, int], kernels: list[str]) -> None:
    """Key padding, keys masked at the start (causal: the first query rows see no key), keys masked in the
    middle (Krea 2's pads sit before its prompt suffix), and a batch row with every key masked (its output
    must be zeros, not cuDNN's average over the masked keys)."""
    b = ProgramBuilder("masked_sdpa")
    q = b.input("q", (5, 80, heads[0], 128), dtype)
    k, v = (b.input(n, (5, 80, heads[1], 128), dtype) for n in "kv")
    mask = b.input("mask", (5, 80), "bool")
    b.output(b.emit("sdpa", q, k, v, mask, causal=causal))
    given = np.ones((5, 80), bool)
    given[1, 57:] = False
    given[2, :9] = False
    given[3, :] = False
    given[4, 20:71] = False
    assert _run(b.build(), 1e-2, {"mask": given}) == [name.format(dt=dtype) for name in kernels]


@pytest.mark.parametrize("half", ["first", "second"])
def test_glu_vectorized(half: str) -> None:
    b = ProgramBuilder("glu")
    x = b.input("x", (3, 40, 2 * 1536), "bf16")
    b.output(b.emit("glu", x, act="silu", gated_half=half))
    _run(b.build(), 1e-2)


@pytest.mark.parametrize("gemm", ["auto", "nvrtc"])  # cuBLASLt S = QK^T / softmax / SV, or the wide flash kernel
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_attention_with_a_wide_head(dtype: str, gemm: str) -> None:
    b = ProgramBuilder("vae_attention")
    q, k, v = (b.input(n, (2, 256, 2, 512), dtype) for n in "qkv")
    b.output(b.emit("sdpa", q, k, v))
    _run(b.build(), 2e-2 if dtype == "bf16" else 1e-4, gemm=gemm)


@pytest.mark.parametrize("bias", [True, False])
def test_cudnn_convolution_matches(bias: bool) -> None:
    b = ProgramBuilder("conv")
    x = b.input("x", (1, 64, 40, 36), "bf16")
    w = b.input("w", (96, 64, 3, 3), "bf16")
    operands = (x, w, b.input("b", (96,), "bf16")) if bias else (x, w)
    b.output(b.emit("conv2d", *operands, padding=(1, 1, 1, 1)))
    _run(b.build(), 1e-2)


def test_a_convolution_whose_plan_wants_more_than_the_shared_workspace_runs_in_the_large_one() -> None:
    """cuDNN's first plan for an NCHW 3x3 convolution wants about its input and output's size as workspace
    (perf/probe_conv_plans.py): at 128 channels and 768^2, some 290 MiB. It runs in the large workspace, not on a
    plan within the shared 256 MiB (5-13x slower on the FLUX.2 VAE decoder), and writes what the convolution
    computes (checked on three output rows)."""
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    from dif_backend_cuda.device import CudaBackend
    from dif_backend_cuda.sdpa import WORKSPACE_BYTES, LargeWorkspace

    c, side = 128, 768
    b = ProgramBuilder("conv")
    x, w = b.input("x", (1, c, side, side), "bf16"), b.input("w", (c, c, 3, 3), "bf16")
    b.output(b.emit("conv2d", x, w, padding=(1, 1, 1, 1)))
    program = b.build()
    rng = np.random.default_rng(5)
    inputs = {"x": rng.standard_normal(x.shape).astype(x.dtype.np),
              "w": (rng.standard_normal(w.shape) / 34).astype(w.dtype.np)}  # fmt: skip
    backend = CudaBackend(tune="off")
    exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), {})
    got = exe.run(inputs)[program.outputs[0]].astype(np.float64)
    (step,) = [s for s in exe.steps if getattr(s, "kind", "") == "cudnn"]
    assert isinstance(step.built.workspace, LargeWorkspace), exe.choices
    assert step.built.workspace.nbytes > WORKSPACE_BYTES
    xf = np.pad(inputs["x"].astype(np.float64)[0], ((0, 0), (1, 1), (1, 1)))
    wf = inputs["w"].astype(np.float64)
    for row in (0, side // 2, side - 1):
        patches = np.stack([xf[:, row + i, j : j + side] for i in range(3) for j in range(3)], axis=1)  # c, 9, W
        want = np.einsum("ocj,cjw->ow", wf.reshape(c, c, 9), patches)
        rel = np.linalg.norm(got[0, :, row] - want) / np.linalg.norm(want)
        assert rel < 1e-2, f"row {row}: rel-L2 {rel:.2e}"


def _force_conv_form(monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """Make the tuning store pick `form` for every convolution (which form is faster depends on the device)."""
    from dif_backend_cuda.tuning import Choices

    choose = Choices.choose

    def pick(self, problem, count, measure):  # type: ignore[no-untyped-def]
        if problem[0] == "conv-form":
            names = problem[-count:]
            return next(i for i, name in enumerate(names) if name.startswith(form)), "cached"
        return choose(self, problem, count, measure)

    monkeypatch.setattr(Choices, "choose", pick)


@pytest.mark.parametrize("bias", [False, True])
def test_convolution_in_two_halves_of_its_outputs(bias: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the tuning store picks the split, the two half-output convolutions write the whole one's result."""
    _force_conv_form(monkeypatch, "cudnn-conv (two halves")
    b = ProgramBuilder("conv")
    x = b.input("x", (1, 32, 20, 18), "f16")
    w = b.input("w", (256, 32, 3, 3), "f16")
    operands = (x, w, b.input("b", (256,), "f16")) if bias else (x, w)
    b.output(b.emit("conv2d", *operands, padding=(1, 1, 1, 1)))
    chosen: list[str] = []
    _run(b.build(), 1e-2, seen=chosen)
    assert chosen == ["cudnn-conv (two halves of the output channels)"], chosen


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "bias"),
    [(3, 1, 1, True), (3, 2, 1, False), (1, 1, 0, True), (3, 1, 0, False)],
)
def test_small_convolution_as_one_gemm(
    kernel: int, stride: int, padding: int, bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A convolution at a small output size as im2col + one cuBLASLt GEMM (a 1x1 one straight on its input)
    writes what the reference computes, with stride, padding and bias."""
    _force_conv_form(monkeypatch, "cublaslt-conv")
    b = ProgramBuilder("conv")
    x = b.input("x", (1, 96, 13, 11), "f16")
    w = b.input("w", (160, 96, kernel, kernel), "f16")
    operands = (x, w, b.input("b", (160,), "f16")) if bias else (x, w)
    b.output(b.emit("conv2d", *operands, stride=(stride, stride), padding=(padding,) * 4))
    chosen: list[str] = []
    _run(b.build(), 1e-2, seen=chosen)
    assert chosen == ["cublaslt-conv (im2col + GEMM)"], chosen


@pytest.mark.parametrize("causal", [True, False])
def test_short_attention_on_the_flash_kernel_where_faster(causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the tuning store picks the NVRTC flash kernel over cuDNN for a short attention (CLIP's 77 tokens),
    it computes the same attention."""
    from dif_backend_cuda.tuning import Choices

    choose = Choices.choose

    def flash_wins(self, problem, count, measure):  # type: ignore[no-untyped-def]
        return (1, "cached") if problem[0] == "sdpa-form" else choose(self, problem, count, measure)

    monkeypatch.setattr(Choices, "choose", flash_wins)
    b = ProgramBuilder("clip_attention")
    q, k, v = (b.input(n, (1, 77, 16, 64), "f16") for n in "qkv")
    b.output(b.emit("sdpa", q, k, v, causal=causal))
    chosen: list[str] = []
    _run(b.build(), 1e-2, seen=chosen)
    assert chosen == ["nvrtc-flash (faster than cuDNN at this size)"], chosen


@pytest.mark.parametrize("gemm", ["cublaslt", "nvrtc"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("dtype", "tol"), [("bf16", 1e-2), ("f16", 5e-3), ("f32", 1e-5)])
def test_linear_add_puts_the_residual_in_the_gemm(dtype: str, tol: float, bias: bool, gemm: str) -> None:
    """linear_add (`fuse_linear_residual`) at a CLIP layer's size: one cuBLASLt GEMM reading r as C with beta 1,
    or, without cuBLASLt, the NVRTC GEMM and the add kernel over its result in place."""
    b = ProgramBuilder("linear_add")
    x, r = b.input("x", (2, 77, 768), dtype), b.input("r", (2, 77, 768), dtype)
    w = b.input("w", (768, 768), dtype)
    bb = b.input("b", (768,), dtype) if bias else None
    b.output(b.emit("linear_add", x, w, r, bb))
    chosen: list[str] = []
    rng = np.random.default_rng(7)
    given = {"w": (rng.standard_normal((768, 768)) / 28).astype(w.dtype.np)}  # |x @ w^T| ~ |r|: both count
    kernels = _run(b.build(), tol, given, seen=chosen, gemm=gemm)
    if gemm == "cublaslt":
        assert kernels == ["cublaslt"] and chosen[0].startswith("cublaslt ("), chosen
    else:
        assert kernels == [f"gemm_{dtype}", f"binary_vec_add_{dtype}"] and chosen == ["nvrtc-gemm + add"], chosen


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_linear_residual_pass_on_cuda_matches_the_interpreter(dtype: str) -> None:
    """The default passes turn `h + linear(x)` and `linear(x) + h` into linear_add on this backend (it declares
    `op:linear_add`); odd widths (77 rows, 40 -> 24 features) as well as a 3-D input."""
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    from dif.passes import optimize
    from dif_backend_cuda.device import CudaBackend

    b = ProgramBuilder("residuals")
    h = b.input("h", (1, 77, 24), dtype)
    x = b.input("x", (1, 77, 40), dtype)
    h = b.emit("add", h, b.emit("linear", x, b.input("w1", (24, 40), dtype), b.input("b1", (24,), dtype)))
    h = b.emit("add", b.emit("linear", h, b.input("w2", (24, 24), dtype)), h)
    b.output(h)
    program, decisions = optimize(b.build(), target=CudaBackend().profile())
    assert program.op_histogram() == {"linear_add": 2}, [d.describe() for d in decisions]
    _run(program, 1e-2 if dtype != "f32" else 1e-5)


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize(("op", "a_shape", "b_shape"), [
    ("mul", (1, 64, 4, 128), (64, 1, 128)),  # a rotary table against heads (rope's VJP)
    ("sub", (2, 16, 96), (16, 96)),
    ("add", (3, 1, 64), (3, 5, 64)),  # the first operand broadcast
    ("mul", (1, 64, 4, 128), (1, 64, 4, 1)),  # a norm's statistic per row: one scalar per chunk
    ("sub", (2, 16, 1), (2, 16, 96)),
])  # fmt: skip
def test_broadcasting_binary_runs_over_chunks(
    dtype: str, op: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> None:
    b = ProgramBuilder("bcast")
    x, y = b.input("x", a_shape, dtype), b.input("y", b_shape, dtype)
    b.output(b.emit(op, x, y))
    kernels = _run(b.build(), 1e-6)
    assert kernels == [f"binary_bvec_{op}_{dtype}"]


@pytest.mark.parametrize(("op", "dtype", "shape", "axes", "tol"), [
    ("reduce_mean", "bf16", (1, 1200, 4096), (-1,), 1e-2),  # a norm's row statistic: 16-byte chunks
    ("reduce_sum", "f32", (64, 16, 128), (1, 2), 1e-5),  # two axes that are one contiguous run
    ("reduce_max", "f32", (300, 1001), (1,), 0.0),  # rows starting off a chunk boundary, and a tail
    ("reduce_sum", "bf16", (8, 40, 24), (0,), 1e-2),  # strided: the general index path
])  # fmt: skip
def test_reductions_over_rows(op: str, dtype: str, shape: tuple[int, ...], axes: tuple[int, ...], tol: float) -> None:
    b = ProgramBuilder("reduce")
    b.output(b.emit(op, b.input("x", shape, dtype), axes=axes))
    kind = "max" if op == "reduce_max" else "sum"
    assert _run(b.build(), tol) == [f"reduce_{kind}_{dtype}"]


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize(("x_shape", "g_shape", "u_shape"), [
    ((1, 64, 4, 128), (64, 1, 128), (1, 64, 4, 128)),  # rope's VJP: g c + rope(g s) with c [S, 1, D]
    ((1, 64, 256), (1, 64, 1), (1, 64, 256)),  # a gate per row
])  # fmt: skip
def test_broadcasting_gated_residual_runs_over_chunks(
    dtype: str, x_shape: tuple[int, ...], g_shape: tuple[int, ...], u_shape: tuple[int, ...]
) -> None:
    b = ProgramBuilder("gated")
    x, g, u = b.input("x", x_shape, dtype), b.input("g", g_shape, dtype), b.input("u", u_shape, dtype)
    b.output(b.emit("gated_residual", x, g, u))
    assert _run(b.build(), 1e-6) == [f"gated_residual_bvec_{dtype}"]
