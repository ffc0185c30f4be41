"""Per-op conformance of the CPU backend: every op of the table at f32 and bf16 against the
reference interpreter, and against a float64 computation (the kit lives in dif.testing)."""

from __future__ import annotations

import pytest

from dif.dtypes import DType
from dif.testing.conformance import ConformanceCase, assert_case, assert_float64, pytest_params
from dif_backend_cpu import CpuBackend

BACKEND = CpuBackend()


@pytest.mark.parametrize("case", pytest_params("cpu"))
def test_op_matches_interpreter(case: ConformanceCase) -> None:
    assert_case(BACKEND, case, strict=True)


@pytest.mark.parametrize("case", pytest_params("cpu"))
def test_op_matches_float64(case: ConformanceCase) -> None:
    assert_float64(BACKEND, case, strict=True)


def test_every_op_has_cases_at_f32() -> None:
    from dif.ops.registry import OPS
    from dif.testing.conformance import HALF_ONLY_OPS, conformance_cases

    covered = {c.op for c in conformance_cases(dtypes=(DType.F32,))}
    assert covered == {op.name for op in OPS} - HALF_ONLY_OPS
