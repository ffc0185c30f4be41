"""CPU backend: follows the plan's arena, equals the reference interpreter bit for bit on random
multi-node programs, and fails clearly on bad weights, inputs, plans and unknown ops."""

from __future__ import annotations

import platform
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from attrs import evolve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dif.dtypes import DType
from dif.errors import DifError, NotImplementedOnBackend, PlanBindingError, PlanError, WeightError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.ops.registry import OpTable
from dif.plan.planner import plan_program
from dif_backend_cpu import ArenaExecutable, CpuBackend

BACKEND = CpuBackend()


def run_cpu(program: Program, inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    plan = plan_program(program, BACKEND.profile(), BACKEND.budget())
    return BACKEND.prepare(program, plan, weights).run(inputs)


def random_arrays(program: Program, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    make = {
        v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in (*program.inputs, *program.params)
    }
    return {v.name: make[v.name] for v in program.inputs}, {v.name: make[v.name] for v in program.params}


def test_profile_and_budget_describe_this_host() -> None:
    profile, budget = BACKEND.profile(), BACKEND.budget()
    assert profile.backend == "cpu" and profile.arch == platform.machine()
    assert profile.compute_units >= 1 and profile.memory_bytes > 0
    assert set(profile.dtypes) == {d.value for d in DType} and profile.tensor_core_formats == ()
    assert 0 < budget.free_memory_bytes <= profile.memory_bytes
    assert profile.fingerprint() == CpuBackend().profile().fingerprint()


# -- random programs ---------------------------------------------------------------------------------

UNARY = ("neg", "tanh", "sigmoid", "silu", "relu", "abs", "gelu", "square", "sin")
BINARY = ("add", "sub", "mul", "maximum", "minimum")


@st.composite
def random_programs(draw: st.DrawFn) -> Program:
    """A chain of 2..14 steps over [B, 8] values, mixing unary, binary, weighted and reshaping ops."""
    dtype = draw(st.sampled_from(("f32", "bf16")))
    rows = draw(st.sampled_from((1, 3)))
    b = ProgramBuilder("random")
    vals: list[Var] = [b.input("x", (rows, 8), dtype), b.input("y", (rows, 8), dtype)]
    for k in range(draw(st.integers(2, 14))):
        pick = lambda: vals[draw(st.integers(0, len(vals) - 1))]  # noqa: E731
        kind = draw(st.sampled_from(("unary", "binary", "linear", "rms_norm", "softmax", "reduce", "split", "t")))
        if kind == "unary":
            v = b.emit(draw(st.sampled_from(UNARY)), pick())
        elif kind == "binary":
            v = b.emit(draw(st.sampled_from(BINARY)), pick(), pick())
        elif kind == "linear":
            v = b.emit("linear", pick(), b.param(f"w{k}", (8, 8), dtype))
        elif kind == "rms_norm":
            v = b.emit("rms_norm", pick(), b.param(f"g{k}", (8,), dtype))
        elif kind == "softmax":
            v = b.emit("softmax", pick())
        elif kind == "reduce":
            v = b.emit("add", pick(), b.emit("reduce_mean", pick(), axes=(1,), keepdims=True))
        elif kind == "split":
            lo, hi = b.emit_multi("split", pick(), axis=1, sizes=(3, 5))
            v = b.emit("concat", hi, b.emit("neg", lo), axis=1)
        else:
            v = b.emit("transpose", b.emit("transpose", pick(), perm=(1, 0)), perm=(1, 0))
        vals.append(v)
    extra = draw(st.lists(st.sampled_from(vals[2:-1]), max_size=2, unique_by=lambda v: v.name)) if len(vals) > 3 else []
    b.output(vals[-1], *extra)
    return b.build()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(), st.integers(0, 2**16))
def test_random_programs_equal_interpreter_exactly(program: Program, seed: int) -> None:
    inputs, weights = random_arrays(program, seed)
    want = interpret(program, inputs, weights)
    got = run_cpu(program, inputs, weights)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_memmap_weights_and_repeated_runs(tmp_path: Path) -> None:
    b = ProgramBuilder("mm")
    x = b.input("x", (2, 16), "bf16")
    w = b.param("w", (4, 16), "bf16")
    b.output(b.emit("silu", b.emit("linear", x, w)))
    program = b.build()
    rng = np.random.default_rng(0)
    path = tmp_path / "w.bin"
    rng.standard_normal((4, 16)).astype(ml_dtypes.bfloat16).tofile(path)
    weights = {"w": np.memmap(path, dtype=ml_dtypes.bfloat16, mode="r", shape=(4, 16))}
    exe = BACKEND.prepare(program, plan_program(program, BACKEND.profile(), BACKEND.budget()), weights)
    for _ in range(2):  # the arena is reused between runs
        xs = {"x": rng.standard_normal((2, 16)).astype(ml_dtypes.bfloat16)}
        got = exe.run(xs)["%1"]
        np.testing.assert_array_equal(got, interpret(program, xs, weights)["%1"])
        assert got.dtype == ml_dtypes.bfloat16
        assert not np.shares_memory(got, exe.arena)


# -- the plan is really followed ----------------------------------------------------------------------


def overlap_program() -> Program:
    """c = a + (-a): exactly zero unless -a is written over a while a is still needed."""
    b = ProgramBuilder("overlap")
    a = b.emit("exp", b.input("x", (64,), "f32"))
    b.output(b.emit("add", a, b.emit("neg", a)))
    return b.build()


def test_bad_plan_corrupts_results_and_is_rejected() -> None:
    program = overlap_program()
    good = plan_program(program, BACKEND.profile(), BACKEND.budget())
    stacked = evolve(good, buffers=tuple(evolve(b, offset=0) for b in good.buffers))
    x = {"x": np.linspace(-1, 1, 64, dtype=np.float32)}
    exe = ArenaExecutable.create(program, stacked, {}, table=BACKEND.table, check=False)
    assert np.abs(exe.run(x)["%2"]).max() > 0.5  # -a overwrote a: the plan, not the op, decides
    np.testing.assert_array_equal(BACKEND.prepare(program, good, {}).run(x)["%2"], np.zeros(64, np.float32))
    with pytest.raises(PlanError, match="overlap"):
        BACKEND.prepare(program, stacked, {})


def test_plan_for_another_program_is_refused() -> None:
    plan = plan_program(overlap_program(), BACKEND.profile(), BACKEND.budget())
    b = ProgramBuilder("other")
    b.output(b.emit("tanh", b.input("x", (64,), "f32")))
    with pytest.raises(PlanBindingError, match="plan was made for program"):
        BACKEND.prepare(b.build(), plan, {})


# -- error paths ---------------------------------------------------------------------------------------


def weighted() -> Program:
    b = ProgramBuilder("weighted")
    b.output(b.emit("linear", b.input("x", (2, 8), "f32"), b.param("w", (4, 8), "f32")))
    return b.build()


def test_weight_binding_errors_name_the_tensor() -> None:
    program = weighted()
    plan = plan_program(program, BACKEND.profile(), BACKEND.budget())
    with pytest.raises(WeightError, match=r"parameter 'w'.*missing"):
        BACKEND.prepare(program, plan, {})
    with pytest.raises(WeightError, match=r"parameter 'w' expected f32\[4,8\], got f32\[8, 4\]"):
        BACKEND.prepare(program, plan, {"w": np.zeros((8, 4), np.float32)})
    with pytest.raises(WeightError, match=r"got bf16\[4, 8\]"):
        BACKEND.prepare(program, plan, {"w": np.zeros((4, 8), ml_dtypes.bfloat16)})
    with pytest.raises(WeightError, match="got list"):
        BACKEND.prepare(program, plan, {"w": [[0.0] * 8] * 4})  # type: ignore[dict-item]
    exe = BACKEND.prepare(program, plan, {"w": np.zeros((4, 8), np.float32), "unused": np.zeros(1)})
    with pytest.raises(DifError, match=r"input 'x'.*not provided"):
        exe.run({})
    with pytest.raises(DifError, match=r"input 'x' expected f32\[2,8\], got f16"):
        exe.run({"x": np.zeros((2, 8), np.float16)})


def test_op_missing_from_the_table_is_not_implemented_on_backend() -> None:
    program = weighted()
    plan = plan_program(program, BACKEND.profile(), BACKEND.budget())
    with pytest.raises(NotImplementedOnBackend, match="no implementation of op 'linear' on backend 'cpu'"):
        CpuBackend(table=OpTable()).prepare(program, plan, {"w": np.zeros((4, 8), np.float32)})


def test_reference_writing_into_its_operand_is_caught() -> None:
    """Operands are read-only views: an op that mutated one would corrupt a live arena value."""
    from dif.ops.registry import OPS, OpDef

    table = OpTable()
    for op in OPS:
        if op.name != "neg":
            table.register(op)
    neg = OPS.get("neg")

    def clobber(x: np.ndarray) -> np.ndarray:
        x *= -1
        return x

    table.register(OpDef("neg", neg.doc, neg.operands, neg.attrs, neg.infer, clobber, neg.cases, neg.category))
    program = overlap_program()
    plan = plan_program(program, BACKEND.profile(), BACKEND.budget())
    with pytest.raises(ValueError, match="read-only"):
        CpuBackend(table=table).prepare(program, plan, {}).run({"x": np.ones(64, np.float32)})
