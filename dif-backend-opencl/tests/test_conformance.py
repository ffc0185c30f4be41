"""Per-op conformance on OpenCL (a CPU runtime in CI): every case of every op in the table at f32, bf16
and f16 against the reference interpreter, f32 against float64, every differentiable case's backward
program, and the unfused attention / im2col paths. `strict=True`: an op without an OpenCL lowering
fails instead of skipping."""

from __future__ import annotations

import numpy as np
import pytest

from dif.dtypes import DType
from dif.ops.registry import OPS
from dif.testing.backward import assert_backward_case, backward_params
from dif.testing.conformance import (
    F32_ONLY_OPS,
    HALF_ONLY_OPS,
    ConformanceCase,
    assert_case,
    assert_float64,
    case_inputs,
    case_program,
    conformance_cases,
    pytest_params,
)

DTYPES = (DType.F32, DType.BF16, DType.F16)
FALLBACK_OPS = ("sdpa", "conv2d")


@pytest.mark.parametrize("case", pytest_params("opencl", dtypes=DTYPES))
def test_op_matches_interpreter(ocl, case: ConformanceCase) -> None:
    assert_case(ocl, case, strict=True)


@pytest.mark.parametrize("case", pytest_params("opencl", dtypes=(DType.F32,)))
def test_op_matches_float64(ocl, case: ConformanceCase) -> None:
    assert_float64(ocl, case, strict=True)


@pytest.mark.parametrize("case", backward_params("opencl"))
def test_backward_program_matches_interpreter(ocl, case: ConformanceCase) -> None:
    """Every differentiable case's VJP program (what `dif train` runs) against the interpreter."""
    assert_backward_case(ocl, case)


@pytest.mark.parametrize("case", pytest_params("opencl-unfused", ops=FALLBACK_OPS, dtypes=DTYPES))
def test_unfused_paths_match_interpreter(ocl_fallback, case: ConformanceCase) -> None:
    assert_case(ocl_fallback, case, strict=True)


F32_ONLY_CASES = {"glu_quant", "concat_glu_quant", "norm_modulate_quant", "rms_norm_modulate_quant", "act_mul_quant"}
"""Ops whose cases are f32 only (dif/ops/quant.py: at bf16 one rounding apart moves a row's amax beyond
an f32 scale's tolerance against float64; the backends check bf16 in their own tests)."""


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_op_has_cases(dtype: DType) -> None:
    covered = {c.op for c in conformance_cases(dtypes=(dtype,))}
    exempt = HALF_ONLY_OPS if dtype == DType.F32 else F32_ONLY_CASES | F32_ONLY_OPS
    assert covered == {op.name for op in OPS} - exempt


def test_unfused_backend_really_avoids_fused_kernels(fresh_backend) -> None:
    from dif.plan.planner import plan_program
    from dif_backend_opencl.lower import LowerOptions

    backend = fresh_backend(
        host_eval_max_bytes=0, options=LowerOptions(fused_attention_max_dim=0, conv3x3_direct=False)
    )
    case = next(c for c in conformance_cases(dtypes=(DType.F32,), ops=["sdpa"]) if c.case.name == "gqa-keymask")
    program = case_program(case)
    exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), {})
    exe.run(case_inputs(case))
    kernels = [s.kernel for s in exe.steps]
    assert "flash_attention" not in kernels
    assert kernels == ["gemm", "attn_softmax", "gemm"] * 2  # per batch element; both kv heads in one block
    assert not any(b.startswith("attention") for b in backend.library.built)


def test_host_eval_is_off_in_conformance(ocl) -> None:
    """The kit's one-node programs are tiny: with host evaluation on they would never reach a kernel."""
    from dif.plan.planner import plan_program

    case = conformance_cases(dtypes=(DType.F32,), ops=["exp"])[0]
    program = case_program(case)
    exe = ocl.prepare(program, plan_program(program, ocl.profile(), ocl.budget()), {})
    assert exe.host_nodes == [] and [s.kernel for s in exe.steps] == ["un_exp"]
    out = exe.run(case_inputs(case))[program.outputs[0]]
    np.testing.assert_allclose(out, np.exp(case.case.operands[0]), rtol=1e-6)
