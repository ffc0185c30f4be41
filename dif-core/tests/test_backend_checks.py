"""dif.backend_checks: every backend rejects a foreign plan and mis-typed weights or inputs alike."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import dif.ops  # noqa: F401  (registers the core ops)
from dif.backend_checks import check_inputs, check_plan_binding, check_weights, describe_array, matches_type
from dif.errors import DifError, PlanBindingError, WeightError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.ir.types import TensorType
from dif.plan.planner import plan_program
from dif.target import RuntimeBudget, TargetProfile


def _program(out: int = 3) -> Program:
    b = ProgramBuilder("tiny")
    x = b.input("x", (2, 4), "f32")
    w = b.param("w", (out, 4), "f32")
    b.output(b.emit("linear", x, w))
    return b.build()


def test_arrays_are_described_and_matched_exactly() -> None:
    t = TensorType((2, 3), "bf16")
    bf16 = np.zeros((2, 3), ml_dtypes.bfloat16)
    assert matches_type(bf16, t) and not matches_type(bf16.astype(np.float32), t)
    assert not matches_type([[0.0] * 3] * 2, t) and not matches_type(np.zeros((2, 3), np.complex64), t)
    assert describe_array(bf16) == "bf16[2, 3]"
    assert describe_array(np.zeros(2, np.complex64)) == "complex64[2]" and describe_array([1]) == "list"


def test_plan_weights_and_inputs_are_checked() -> None:
    program = _program()
    plan = plan_program(program, TargetProfile(backend="x", device="y", dtypes=("f32",)), RuntimeBudget(1 << 30))
    check_plan_binding(program, plan, "x")
    with pytest.raises(PlanBindingError, match="backend 'x': plan was made for program"):
        check_plan_binding(_program(5), plan, "x")
    w = np.ones((3, 4), np.float32)
    assert list(check_weights(program, {"w": w, "extra": w}, "x")) == ["w"]
    with pytest.raises(WeightError, match="parameter 'w' .* is missing"):
        check_weights(program, {}, "x")
    with pytest.raises(WeightError, match=r"'w' expected f32\[3,4\], got f16\[3, 4\]"):
        check_weights(program, {"w": w.astype(np.float16)}, "x")
    x = np.zeros((2, 4), np.float32)
    assert check_inputs(program, {"x": x}, "x")["x"] is x
    with pytest.raises(DifError, match="input 'x' .* was not provided"):
        check_inputs(program, {}, "x")
    with pytest.raises(DifError, match=r"input 'x' expected f32\[2,4\], got f32\[4, 2\]"):
        check_inputs(program, {"x": x.T}, "x")
