"""`linear_add`'s GEMM without a GPU: the cuBLASLt problem of a linear with a residual reads it as C with beta 1
in a layout of its own (D's type and shape), keys its heuristic and tuned choice apart from the same GEMM
without C (whose key stays what it was), and `LtMatmul` hands cuBLASLt exactly that, checked against a
recording stand-in for nvmath's cuBLASLt binding."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import numpy as np

from dif.dtypes import DType
from dif_backend_cuda.gemm import CUDA_DTYPE, LtContext, LtMatmul, _alignment, linear_problem, problem_key

X, W, Y, R, B = 0x10000, 0x20000, 0x30000, 0x40040, 0x50000  # R is 64-byte aligned, the others 256


class FakeLt:
    """The calls `LtMatmul` makes of `nvmath.bindings.cublasLt`, recorded (values read through the pointers)."""

    MatmulDescAttribute = SimpleNamespace(TRANSA=0, TRANSB=1, EPILOGUE=2, BIAS_POINTER=3, BIAS_DATA_TYPE=4)
    Epilogue = SimpleNamespace(BIAS=4)
    MatrixLayoutAttribute = SimpleNamespace(BATCH_COUNT=0, STRIDED_BATCH_OFFSET=1)
    MatmulPreferenceAttribute = SimpleNamespace(
        MAX_WORKSPACE_BYTES=0, MIN_ALIGNMENT_A_BYTES=1, MIN_ALIGNMENT_B_BYTES=2, MIN_ALIGNMENT_C_BYTES=3,
        MIN_ALIGNMENT_D_BYTES=4,
    )  # fmt: skip
    matmul_heuristic_result_dtype = np.dtype([("algo", "u8", (8,)), ("workspaceSize", "u8"), ("state", "i4")])

    def __init__(self) -> None:
        self.handles = 100
        self.layouts: dict[int, tuple[int, int, int, int]] = {}
        self.destroyed: list[int] = []
        self.prefs: dict[int, int] = {}
        self.heuristic_cd: tuple[int, int] | None = None
        self.calls: list[dict[str, Any]] = []

    def _new(self) -> int:
        self.handles += 1
        return self.handles

    def matmul_desc_create(self, compute: int, scale: int) -> int:
        return self._new()

    def get_matmul_desc_attribute_dtype(self, attr: int) -> Any:
        return np.int64

    def matmul_desc_set_attribute(self, desc: int, attr: int, ptr: int, size: int) -> None:
        pass

    def matmul_desc_destroy(self, desc: int) -> None:
        pass

    def matrix_layout_create(self, dt: int, rows: int, cols: int, ld: int) -> int:
        handle = self._new()
        self.layouts[handle] = (dt, rows, cols, ld)
        return handle

    def get_matrix_layout_attribute_dtype(self, attr: int) -> Any:
        return np.int64

    def matrix_layout_set_attribute(self, layout: int, attr: int, ptr: int, size: int) -> None:
        pass

    def matrix_layout_destroy(self, layout: int) -> None:
        self.destroyed.append(layout)

    def matmul_preference_create(self) -> int:
        return self._new()

    def get_matmul_preference_attribute_dtype(self, attr: int) -> Any:
        return np.uint64

    def matmul_preference_set_attribute(self, pref: int, attr: int, ptr: int, size: int) -> None:
        self.prefs[attr] = ctypes.c_uint64.from_address(ptr).value

    def matmul_preference_destroy(self, pref: int) -> None:
        pass

    def matmul_algo_get_heuristic(self, handle, desc, a, b, c, d, pref, n, results, count) -> None:  # type: ignore[no-untyped-def]
        self.heuristic_cd = (c, d)
        ctypes.c_int32.from_address(count).value = 1

    def matmul(self, handle, desc, alpha, a, adesc, b, bdesc, beta, c, cdesc, d, ddesc, *rest) -> None:  # type: ignore[no-untyped-def]
        self.calls.append({
            "alpha": ctypes.c_float.from_address(alpha).value, "beta": ctypes.c_float.from_address(beta).value,
            "a": a, "b": b, "c": c, "cdesc": cdesc, "d": d, "ddesc": ddesc,
        })  # fmt: skip


def _context(lib: FakeLt) -> LtContext:
    ctx = object.__new__(LtContext)  # without cupy: the handle and workspace are never dereferenced here
    ctx.lib, ctx.handle, ctx.workspace = lib, 1, SimpleNamespace(ptr=0)
    ctx.workspace_bytes, ctx.version, ctx.choices, ctx.heuristics = 1 << 20, 0, None, {}
    return ctx


def _problem(residual: bool, bias: bool = True) -> Any:
    r = {"residual": R} if residual else {}
    return linear_problem(DType.BF16, X, W, Y, B if bias else 0, rows=77, k=64, out=48, **r)


def test_the_residual_is_c_with_beta_one_and_keys_apart() -> None:
    with_c, plain = _problem(True), _problem(False)
    assert (with_c.c, with_c.ldc, with_c.beta) == (R, 48, 1.0) and (plain.c, plain.beta) == (0, 0.0)
    assert problem_key(with_c) != problem_key(plain) and problem_key(with_c)[: len(problem_key(plain))] == (
        problem_key(plain)
    )
    assert problem_key(with_c)[-4:] == ("C", 1.0, 48, _alignment(R)) and _alignment(R) == 64
    assert len(problem_key(plain)) == 18  # the key a GEMM without C always had: stored choices stay valid
    strided = linear_problem(DType.BF16, X, W, Y, 0, 77, 64, 48, residual=R, ldr=96)
    assert strided.ldc == 96 and problem_key(strided) != problem_key(_problem(True, bias=False))


def test_lt_matmul_reads_the_residual_through_its_own_layout() -> None:
    lib = FakeLt()
    step = LtMatmul(_context(lib), _problem(True))
    assert step.cdesc != step.ddesc
    bf16 = CUDA_DTYPE[DType.BF16]
    assert lib.layouts[step.cdesc] == lib.layouts[step.ddesc] == (bf16, 48, 77, 48)  # column-major y^T [out, rows]
    assert lib.heuristic_cd == (step.cdesc, step.ddesc)
    assert lib.prefs[FakeLt.MatmulPreferenceAttribute.MIN_ALIGNMENT_C_BYTES] == 64  # R's alignment, not Y's
    assert lib.prefs[FakeLt.MatmulPreferenceAttribute.MIN_ALIGNMENT_D_BYTES] == 256
    assert step.tune(SimpleNamespace(ptr=0)) == "algorithm 1 of 1 (heuristic)"
    step(SimpleNamespace(ptr=0))
    (call,) = lib.calls[-1:]
    assert (call["c"], call["cdesc"], call["d"], call["ddesc"]) == (R, step.cdesc, Y, step.ddesc)
    assert (call["alpha"], call["beta"]) == (1.0, 1.0) and (call["a"], call["b"]) == (W, X)
    layouts = {step.adesc, step.bdesc, step.cdesc, step.ddesc}
    step.__del__()
    assert sorted(lib.destroyed) == sorted(layouts)  # each layout once


def test_lt_matmul_without_a_residual_is_unchanged() -> None:
    lib = FakeLt()
    ctx = _context(lib)
    step = LtMatmul(ctx, _problem(False))
    assert step.cdesc == step.ddesc and lib.heuristic_cd == (step.ddesc, step.ddesc)
    assert lib.prefs[FakeLt.MatmulPreferenceAttribute.MIN_ALIGNMENT_C_BYTES] == 256
    step(SimpleNamespace(ptr=0))
    assert (lib.calls[-1]["c"], lib.calls[-1]["beta"]) == (Y, 0.0)
    step.__del__()
    assert len(lib.destroyed) == len(set(lib.destroyed)) == 3
    LtMatmul(ctx, _problem(True))  # the same shape with C: a heuristic of its own, not the stored one
    assert len(ctx.heuristics) == 2
