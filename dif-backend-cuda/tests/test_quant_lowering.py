"""The quantized lowerings' cuBLASLt paths without a GPU: a fake cuBLASLt (the nvmath binding calls the
lowering makes, recorded) checks what each W8A8 GEMM asks for - fp8 operand types, outer-vector scale modes
and pointers (weights on A, activations on B), bias epilogue, bf16 out - and how the blocked path splits rows
(int8; fp8 when the outer-vector scales are refused), each block followed by the scaled epilogue launch with
the arguments its kernel signature declares."""

from __future__ import annotations

import ctypes
import types
from typing import Any

import numpy as np
import pytest

from dif.ir.builder import ProgramBuilder
from dif.ops.registry import OPS
from dif_backend_cuda.lower import DevTensor, Launch, LowerCtx, lower_node

from .test_lowering import _check_args, _FakeBackend, _signatures


class FakeLt:
    """Records descriptor attributes, layouts and matmul calls; the heuristic finds one algorithm unless
    `refuse` names an attribute whose descriptors it refuses."""

    def __init__(self, refuse: str | None = None, outer_vec: bool = True) -> None:
        names = ["TRANSA", "TRANSB", "EPILOGUE", "BIAS_POINTER", "BIAS_DATA_TYPE", "FAST_ACCUM"]
        if outer_vec:
            names += ["A_SCALE_MODE", "B_SCALE_MODE", "A_SCALE_POINTER", "B_SCALE_POINTER"]
        self.MatmulDescAttribute = types.SimpleNamespace(**{n: n for n in names})
        self.MatmulPreferenceAttribute = types.SimpleNamespace(
            **{n: n for n in ["MAX_WORKSPACE_BYTES", *(f"MIN_ALIGNMENT_{x}_BYTES" for x in "ABCD")]}
        )
        self.Epilogue = types.SimpleNamespace(BIAS=4)
        self.matmul_heuristic_result_dtype = np.dtype([("algo", "u1", 64), ("state", "i4")])
        self.descs: list[dict[str, Any]] = []
        self.layouts: list[tuple[int, int, int, int]] = []
        self.calls: list[tuple[int, ...]] = []
        self.c_beta: list[tuple[int, float]] = []  # each call's C and beta
        self.refuse = refuse

    def matmul_desc_create(self, compute: int, scale: int) -> int:
        self.descs.append({"compute": compute, "scale": scale})
        return len(self.descs) - 1

    def get_matmul_desc_attribute_dtype(self, attr: str) -> Any:
        return np.int64

    def matmul_desc_set_attribute(self, desc: int, attr: str, ptr: int, size: int) -> None:
        self.descs[desc][attr] = int(ctypes.c_int64.from_address(ptr).value)

    def matrix_layout_create(self, dtype: int, rows: int, cols: int, ld: int) -> int:
        self.layouts.append((dtype, rows, cols, ld))
        return len(self.layouts) - 1

    def matrix_layout_destroy(self, layout: int) -> None:
        pass

    def matmul_desc_destroy(self, desc: int) -> None:
        pass

    def matmul_preference_create(self) -> int:
        return 0

    def matmul_preference_destroy(self, pref: int) -> None:
        pass

    def get_matmul_preference_attribute_dtype(self, attr: str) -> Any:
        return np.uint64

    def matmul_preference_set_attribute(self, pref: int, attr: str, ptr: int, size: int) -> None:
        pass

    def matmul_algo_get_heuristic(self, handle, desc, a, b, c, d, pref, n, results, count) -> None:  # type: ignore[no-untyped-def]
        ctypes.c_int32.from_address(count).value = 0 if self.refuse and self.refuse in self.descs[desc] else 1

    def matmul(self, handle, desc, alpha, a, adesc, b, bdesc, beta, c, cdesc, d, ddesc, algo, ws, wsb, stream):  # type: ignore[no-untyped-def]
        self.calls.append((desc, a, b, d))
        self.c_beta.append((c, ctypes.c_float.from_address(beta).value))


class FakeContext:
    def __init__(self, lib: FakeLt) -> None:
        self.lib, self.handle, self.workspace_bytes = lib, 1, 1 << 20
        self.workspace = types.SimpleNamespace(ptr=1 << 40)


class LtBackend(_FakeBackend):
    def __init__(self, sigs: Any, lib: FakeLt) -> None:
        super().__init__(sigs)
        self.options = {**self.options, "gemm": "auto"}
        self._lt = FakeContext(lib)
        self._dif_int8_scratch = types.SimpleNamespace(ptr=1 << 41)  # no cupy here

    def lt(self) -> Any:
        return self._lt


def lower_scaled(
    backend: Any, q: str, rows: int, k: int, out: int, bias: bool, gate: tuple[int, ...] | None = None
) -> tuple[list[Any], LowerCtx, dict]:
    """One scaled_linear over [rows, k] -> [rows, out], bf16 out; with `gate` (its shape) the
    scaled_linear_gated_residual over a residual x [rows, out]."""
    b = ProgramBuilder("sl")
    xq, xs = b.input("xq", (rows, k), q), b.input("xs", (rows, 1), "f32")
    wq, ws = b.param("wq", (out, k), q), b.param("ws", (out,), "f32")
    bv = b.param("b", (out,), "bf16") if bias else None
    if gate is None:
        b.output(b.emit("scaled_linear", xq, xs, wq, ws, bv, out_dtype="bf16"))
    else:
        x, g = b.input("x", (rows, out), "bf16"), b.input("gate", gate, "bf16")
        b.output(b.emit("scaled_linear_gated_residual", x, g, xq, xs, wq, ws, bv))
    program = b.build()
    base, tensors = 1 << 32, {}
    for name, t in program.types.items():
        tensors[name] = DevTensor(base, t.shape, t.dtype)
        base += (t.nbytes + 255) // 256 * 256 + 256
    ctx = LowerCtx(backend, OPS)
    node = program.nodes[0]
    tensors["y"] = tensors[node.results[0].name]
    steps = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
    return steps, ctx, tensors


@pytest.fixture(scope="module")
def sigs() -> dict[str, dict[str, list[str]]]:
    return _signatures()


def test_fp8_is_one_cublaslt_call_with_outer_vector_scales(sigs: Any) -> None:
    lib = FakeLt()
    steps, ctx, t = lower_scaled(LtBackend(sigs, lib), "f8e4m3", 300, 256, 512, bias=True)
    (step,) = steps
    assert "outer-vector" in ctx.choices[0]
    desc = lib.descs[-1]
    assert desc["compute"] == 68 and desc["scale"] == 0  # fp32 compute and scales
    assert desc["A_SCALE_MODE"] == desc["B_SCALE_MODE"] == 3  # OUTER_VEC_32F
    assert desc["A_SCALE_POINTER"] == t["ws"].ptr and desc["B_SCALE_POINTER"] == t["xs"].ptr
    assert desc["EPILOGUE"] == 4 and desc["BIAS_POINTER"] == t["b"].ptr and desc["BIAS_DATA_TYPE"] == 14
    assert desc["TRANSA"] == 1 and desc["TRANSB"] == 0  # TN, as Hopper's fp8 GEMMs require
    assert lib.layouts[-3:] == [(28, 256, 512, 256), (28, 256, 300, 256), (14, 512, 300, 512)]
    step(types.SimpleNamespace(ptr=0))
    assert lib.calls == [(len(lib.descs) - 1, t["wq"].ptr, t["xq"].ptr, t["y"].ptr)]


def test_int8_runs_in_row_blocks_each_with_the_scaled_epilogue(sigs: Any) -> None:
    lib = FakeLt()
    rows, k, out = 5000, 128, 4096  # 64 MiB of int32 holds 4096 rows of 4096: two blocks (4096 + 904)
    steps, ctx, t = lower_scaled(LtBackend(sigs, lib), "i8", rows, k, out, bias=False)
    assert "2 row block(s)" in ctx.choices[0]
    assert [type(s).__name__ for s in steps] == ["BlockMatmul", "Launch", "BlockMatmul", "Launch"]
    assert {d["compute"] for d in lib.descs} == {72}  # int32 compute
    heights = sorted(layout[2] for layout in lib.layouts if layout[0] == 10)  # the int32 D layouts: one per height
    assert heights == [904, 4096]
    first, second = steps[0], steps[2]
    assert second.xq - first.xq == 4096 * k  # the second block starts 4096 rows on
    for s in steps[1::2]:
        assert isinstance(s, Launch) and s.name == "scaled_epilogue_i32_bf16"
        _check_args(s)
    assert int(steps[3].args[4]) == t["y"].ptr + 4096 * out * 2  # y of the second block, bf16
    assert int(steps[3].args[1]) == t["xs"].ptr + 4096 * 4  # and its activation scales


def test_fp8_without_outer_vector_scales_takes_the_blocked_path(sigs: Any) -> None:
    lib = FakeLt(outer_vec=False)
    steps, ctx, _ = lower_scaled(LtBackend(sigs, lib), "f8e4m3", 64, 256, 512, bias=True)
    assert "raw products" in ctx.choices[0] and "outer-vector scales" in ctx.choices[0]
    assert [type(s).__name__ for s in steps] == ["BlockMatmul", "Launch"]
    assert steps[1].name == "scaled_epilogue_f32_bf16"
    assert lib.layouts[-1][0] == 0  # fp32 products


def test_a_refusing_cublaslt_falls_back_to_the_tile_gemm(sigs: Any) -> None:
    lib = FakeLt(refuse="TRANSA")  # every descriptor refused
    steps, ctx, _ = lower_scaled(LtBackend(sigs, lib), "i8", 64, 256, 512, bias=True)
    (step,) = steps
    assert step.name == "scaled_gemm_i8_bf16" and "nvrtc scaled tile GEMM" in ctx.choices[0]
    _check_args(step)


def test_a_gated_residual_is_the_fp8_gemm_with_the_gate_in_its_scales_and_the_residual_as_c(sigs: Any) -> None:
    lib = FakeLt()
    backend = LtBackend(sigs, lib)
    steps, ctx, t = lower_scaled(backend, "f8e4m3", 300, 256, 512, bias=True, gate=(1, 512))
    gate, step = steps
    assert "the residual as C" in ctx.choices[0]
    assert isinstance(gate, Launch) and gate.name == "gate_channels_bf16"
    _check_args(gate)
    scratch = backend._dif_int8_scratch.ptr
    assert [int(a) for a in gate.args[:5]] == [t["ws"].ptr, t["gate"].ptr, t["b"].ptr, scratch, scratch + 2048]
    desc = lib.descs[-1]
    assert desc["A_SCALE_POINTER"] == scratch and desc["BIAS_POINTER"] == scratch + 2048  # what the kernel wrote
    assert desc["B_SCALE_POINTER"] == t["xs"].ptr
    step(types.SimpleNamespace(ptr=0))
    assert lib.calls[-1][3] == t["y"].ptr and lib.c_beta[-1] == (t["x"].ptr, 1.0)


@pytest.mark.parametrize(("q", "gate", "why"), [("f8e4m3", (300, 1), "a gate of shape (300, 1)"),
                                                ("i8", (512,), "i8 operands")])  # fmt: skip
def test_a_gated_residual_the_epilogue_cannot_take_runs_in_place_after_the_gemm(
    sigs: Any, q: str, gate: tuple[int, ...], why: str
) -> None:
    lib = FakeLt()
    steps, ctx, t = lower_scaled(LtBackend(sigs, lib), q, 300, 256, 512, bias=False, gate=gate)
    assert why in ctx.choices[0] and "then the gated residual in place" in ctx.choices[0]
    *gemm, residual = steps
    assert not any(getattr(s, "name", "").startswith("gate_channels") for s in gemm)
    assert residual.name.startswith("gated_residual") and residual.name.endswith("_bf16")
    _check_args(residual)
    assert t["y"].ptr in [int(a) for a in residual.args if isinstance(a, np.uint64)]
    for s in gemm:
        if not isinstance(s, Launch):
            s(types.SimpleNamespace(ptr=0))
    assert lib.calls and [(c, beta) for c, beta in lib.c_beta] == [(call[3], 0.0) for call in lib.calls]  # C is D
