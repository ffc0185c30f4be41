"""The reference interpreter: binding checks, casting to declared types, outputs and multi-results."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dif.errors import DifError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program


def mlp(dtype: str = "f32") -> Program:
    b = ProgramBuilder("mlp")
    x = b.input("x", (3, 8), dtype)
    w = b.param("w", (4, 8), dtype)
    h = b.emit("linear", x, w)
    y = b.emit("silu", h)
    b.output(y, h)  # h is used by silu and is also an output: must survive freeing
    return b.build()


def test_matches_hand_computation_f32() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal((4, 8)).astype(np.float32)
    out = interpret(mlp(), {"x": x}, {"w": w})
    h = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(out["%0"], h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["%1"], h / (1 + np.exp(-h)), rtol=1e-5, atol=1e-6)
    assert list(out) == ["%1", "%0"]


def test_results_are_rounded_to_declared_bf16() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)
    out = interpret(mlp("bf16"), {"x": x}, {"w": w})
    assert out["%0"].dtype == ml_dtypes.bfloat16 and out["%1"].dtype == ml_dtypes.bfloat16
    # silu reads the *stored* (bf16-rounded) h, as a bf16 kernel chain would.
    h = out["%0"].astype(np.float32)
    expect = (h / (1 + np.exp(-h))).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out["%1"].astype(np.float32), expect.astype(np.float32))


def test_bind_check_names_the_problem() -> None:
    x = np.zeros((3, 8), np.float32)
    w = np.zeros((4, 8), np.float32)
    with pytest.raises(DifError, match=r"input 'x'.*not provided"):
        interpret(mlp(), {}, {"w": w})
    with pytest.raises(DifError, match=r"parameter 'w'.*not provided"):
        interpret(mlp(), {"x": x}, {})
    with pytest.raises(DifError, match=r"input 'x': expected f32\[3,8\], got f32\[8, 3\]"):
        interpret(mlp(), {"x": x.T.copy()}, {"w": w})
    with pytest.raises(DifError, match="parameter 'w': expected f32"):
        interpret(mlp(), {"x": x}, {"w": w.astype(np.float16)})


def test_multi_result_and_input_passthrough_outputs() -> None:
    b = ProgramBuilder("split")
    x = b.input("x", (2, 5), "f32")
    p, q = b.emit_multi("split", x, axis=1, sizes=(2, 3))
    b.output(q, x, b.emit("neg", p))
    x_val = np.arange(10, dtype=np.float32).reshape(2, 5)
    out = interpret(b.build(), {"x": x_val}, {})
    np.testing.assert_array_equal(out["%0.1"], x_val[:, 2:])
    np.testing.assert_array_equal(out["x"], x_val)
    np.testing.assert_array_equal(out["%1"], -x_val[:, :2])
