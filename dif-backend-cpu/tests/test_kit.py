"""The conformance kit itself: tolerances, comparison, and that it catches a wrong backend."""

from __future__ import annotations

from collections.abc import Mapping

import ml_dtypes
import numpy as np
import pytest

from dif.dtypes import DType
from dif.errors import NotImplementedOnBackend
from dif.ir.program import Program
from dif.plan.plan import Plan
from dif.testing.conformance import (
    FAIL,
    PASS,
    UNSUPPORTED,
    check_against_float64,
    conformance_cases,
    run_case,
    run_conformance,
)
from dif.testing.tolerances import Tolerance, compare, tolerance_for
from dif_backend_cpu import CpuBackend


def test_tolerance_table() -> None:
    assert tolerance_for(DType.F32) == Tolerance(1e-5, 1e-6)
    assert tolerance_for(DType.I32).exact and tolerance_for(DType.BOOL, reduction=1000).exact
    assert tolerance_for(DType.F32, reduction=64).rtol == pytest.approx(8e-5)
    assert tolerance_for(DType.BF16).rtol > tolerance_for(DType.F16).rtol > tolerance_for(DType.F32).rtol


def test_compare_floats_ints_and_specials() -> None:
    want = np.array([1.0, -2.0, 1e-3, np.inf, np.nan], np.float32)
    assert compare(want.copy(), want, tolerance_for(DType.F32)).ok
    off = want.copy()
    off[0] *= 1 + 1e-4
    bad = compare(off, want, tolerance_for(DType.F32))
    assert not bad.ok and bad.max_abs == pytest.approx(1e-4, rel=1e-2) and "1 of 5" in bad.detail
    assert compare(off, want, tolerance_for(DType.BF16)).ok
    nan_for_inf = want.copy()
    nan_for_inf[3] = np.nan
    assert "non-finite" in compare(nan_for_inf, want, tolerance_for(DType.F32)).detail
    assert not compare(np.array([1, 2], np.int32), np.array([1, 3], np.int32), tolerance_for(DType.I32)).ok
    assert not compare(np.zeros(3), np.zeros(4), tolerance_for(DType.F32)).ok
    one_ulp = np.array([1.0], ml_dtypes.bfloat16) + np.array([2**-7], ml_dtypes.bfloat16)
    assert compare(one_ulp, np.array([1.0], np.float32), tolerance_for(DType.BF16)).ok


class NoisyBackend(CpuBackend):
    """A wrong backend: every float output is off by 1e-3 relative."""

    name = "noisy"

    def prepare(self, program: Program, plan: Plan, weights: Mapping[str, np.ndarray]):  # type: ignore[no-untyped-def]
        inner = super().prepare(program, plan, weights)

        class Run:
            def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
                out = inner.run(inputs)
                return {k: (v * 1.001).astype(v.dtype) if v.dtype == np.float32 else v for k, v in out.items()}

        return Run()


class PartialBackend(CpuBackend):
    name = "partial"

    def prepare(self, program, plan, weights):  # type: ignore[no-untyped-def]
        raise NotImplementedOnBackend(program.nodes[0].op, self.name)


def test_kit_catches_a_wrong_backend_and_reports_unsupported_ops() -> None:
    case = next(c for c in conformance_cases(dtypes=(DType.F32,), ops=["exp"]))
    assert run_case(CpuBackend(), case).status == PASS
    bad = run_case(NoisyBackend(), case)
    assert bad.status == FAIL and bad.max_rel == pytest.approx(1e-3, rel=1e-2)
    assert check_against_float64(case, NoisyBackend()).status == FAIL
    assert check_against_float64(case).status == PASS  # the interpreter itself vs float64
    report = run_conformance(PartialBackend(), ops=["exp", "add"], dtypes=(DType.F32,))
    assert report.passed and report.results and all(r.status == UNSUPPORTED for r in report.results)
    noisy = run_conformance(NoisyBackend(), ops=["exp", "less"], dtypes=(DType.F32,), float64=True)
    assert not noisy.passed
    assert {r.op for r in noisy.failures} == {"exp"}  # bool results of 'less' are untouched
    assert "FAIL" in noisy.summary() and "exp-f32" in noisy.summary()


def test_cases_are_deterministic() -> None:
    a = conformance_cases(ops=["matmul"], seed=3)
    b = conformance_cases(ops=["matmul"], seed=3)
    assert [c.id for c in a] == [c.id for c in b] and a
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x.case.operands, y.case.operands, strict=True):
            np.testing.assert_array_equal(u, v)
