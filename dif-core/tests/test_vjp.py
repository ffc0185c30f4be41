"""The op table's VJP column: every differentiable op's VJP program against central finite differences
of the op's own reference in float64 (cases generated from the ops' conformance cases), the backward
programs on the CPU backend against the interpreter, and the error for an op without a rule."""

from __future__ import annotations

import pytest

from dif.autodiff import NoVjpError, grad_program, has_vjp, vjp_rule
from dif.autodiff.registry import NON_DIFFERENTIABLE
from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder
from dif.ops.registry import OPS
from dif.testing.backward import (
    assert_backward_case,
    assert_vjp_float64,
    backward_params,
    check_vjp_float64,
    differentiable_cases,
)
from dif.testing.conformance import ConformanceCase

# the ops FLUX.2 / Krea 2 (DiTs, VAEs, Qwen3 / Qwen3-VL text stacks) emit, read off their builders
MODEL_OPS = (
    "add", "clamp", "concat", "conv2d", "embedding", "gelu", "glu", "group_norm", "l2_normalize", "layer_norm",
    "linear", "modulate", "mul", "reshape", "rms_norm", "rope", "scalar_affine", "sdpa", "sigmoid", "silu",
    "slice", "split", "sqrt", "transpose", "upsample_nearest",
)  # fmt: skip


@pytest.mark.parametrize("case", backward_params(dtypes=(DType.F32,)))
def test_vjp_matches_finite_differences_in_float64(case: ConformanceCase) -> None:
    assert_vjp_float64(case)


@pytest.mark.parametrize("case", backward_params("cpu"))
def test_backward_program_runs_on_cpu_backend(case: ConformanceCase) -> None:
    CpuBackend = pytest.importorskip("dif_backend_cpu", reason="the CPU backend is another distribution").CpuBackend  # noqa: N806

    assert_backward_case(CpuBackend(), case)


def test_every_model_op_has_a_checked_vjp() -> None:
    covered = {c.op for c in differentiable_cases(dtypes=(DType.F32,))}
    assert set(MODEL_OPS) <= covered, sorted(set(MODEL_OPS) - covered)


def test_every_op_either_has_a_vjp_or_refuses_by_name() -> None:
    for op in OPS:
        if has_vjp(op.name):
            assert op.name in NON_DIFFERENTIABLE or callable(vjp_rule(op.name))
        else:
            with pytest.raises(NoVjpError, match=f"op '{op.name}' has no VJP rule"):
                vjp_rule(op.name)


def test_a_wrong_rule_is_caught_by_the_finite_difference_check(monkeypatch: pytest.MonkeyPatch) -> None:
    import dif.autodiff.registry as registry

    registry._load_rules()
    monkeypatch.setitem(registry._RULES, "sin", lambda a: [a.b.emit("mul", a.g, a.b.emit("sin", a.x))])
    results = [check_vjp_float64(c) for c in differentiable_cases(dtypes=(DType.F32,), ops=["sin"])]
    assert results and all(r.status == "fail" for r in results)


def test_differentiating_through_an_op_without_a_rule_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import dif.autodiff.registry as registry

    registry._load_rules()
    monkeypatch.delitem(registry._RULES, "silu")
    b = ProgramBuilder("f")
    x = b.input("x", (3,), "f32")
    with b.scope(module="m", block="blk"):
        y = b.emit("silu", x)
    b.output(b.emit("reduce_sum", y, axes=(0,)))
    prog = b.build()
    with pytest.raises(NoVjpError, match=r"op 'silu' has no VJP rule.*node 0 \(silu\) at m/blk"):
        grad_program(prog, ["x"], loss=prog.outputs[0])


def test_rope_tables_refuse_a_gradient() -> None:
    b = ProgramBuilder("f")
    x = b.input("x", (1, 2, 1, 4), "f32")
    c = b.input("c", (2, 4), "f32")
    s = b.input("s", (2, 4), "f32")
    b.output(b.emit("reduce_sum", b.emit("rope", x, c, s, mode="half"), axes=(0, 1, 2, 3)))
    prog = b.build()
    with pytest.raises(NoVjpError, match="rotary tables"):
        grad_program(prog, ["x", "c"], loss=prog.outputs[0])
