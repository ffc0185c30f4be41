"""The CPU executor honours the planner's reshape aliases: an aliased reshape is never run (its view
already shows the root's bytes), and random programs full of reshapes equal the interpreter bit for bit."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dif.interp import interpret
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.plan.plan import ALIAS_CAPABILITY
from dif.plan.planner import plan_program
from dif_backend_cpu import CpuBackend

BACKEND = CpuBackend()
SHAPES = ((24,), (2, 12), (4, 6), (2, 3, 4), (1, 24))


def test_cpu_profile_declares_aliasing_and_every_op() -> None:
    caps = BACKEND.profile().capabilities
    assert ALIAS_CAPABILITY in caps and "op:*" in caps


def test_aliased_reshapes_are_not_run() -> None:
    b = ProgramBuilder("alias")
    a = b.emit("exp", b.input("x", (4, 6), "f32"))
    r = b.emit("reshape", b.emit("reshape", a, shape=(24,)), shape=(2, 12))
    b.output(b.emit("neg", r), r)
    program = b.build()
    plan = plan_program(program, BACKEND.profile(), BACKEND.budget())
    exe = BACKEND.prepare(program, plan, {})
    assert exe.aliased == {1, 2}

    def never(operands, attrs):  # type: ignore[no-untyped-def]
        raise AssertionError("an aliased reshape was executed")

    for node_id in exe.aliased:
        exe.kernels[node_id] = never
    x = {"x": np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)}
    got = exe.run(x)
    want = interpret(program, x, {})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert not np.shares_memory(got["%2"], exe.arena)  # outputs are copies, aliases included


@st.composite
def reshaping_programs(draw: st.DrawFn) -> Program:
    """Values of 24 elements in several shapes; reshapes (often chained, sometimes of inputs or of
    values still used later) between unary and binary ops; outputs may be aliases."""
    dtype = draw(st.sampled_from(("f32", "bf16")))
    b = ProgramBuilder("reshaping")
    vals: list[Var] = [b.input("x", draw(st.sampled_from(SHAPES)), dtype), b.input("y", (24,), dtype)]
    for _ in range(draw(st.integers(2, 16))):
        pick = lambda: vals[draw(st.integers(0, len(vals) - 1))]  # noqa: E731
        kind = draw(st.sampled_from(("reshape", "reshape", "unary", "binary", "norm")))
        if kind == "reshape":
            v = b.emit("reshape", pick(), shape=draw(st.sampled_from(SHAPES)))
        elif kind == "unary":
            v = b.emit(draw(st.sampled_from(("neg", "exp", "tanh", "silu"))), pick())
        elif kind == "binary":
            a, c = pick(), pick()
            v = b.emit(draw(st.sampled_from(("add", "mul", "sub"))), a, b.emit("reshape", c, shape=a.shape))
        else:
            v = b.emit("rms_norm", b.emit("reshape", pick(), shape=(4, 6)))
        vals.append(v)
    extra = draw(st.lists(st.sampled_from(vals[2:-1]), max_size=3, unique_by=lambda v: v.name)) if len(vals) > 3 else []
    b.output(vals[-1], *extra)
    return b.build()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reshaping_programs(), st.integers(0, 2**16))
def test_random_programs_with_aliases_equal_interpreter(program: Program, seed: int) -> None:
    rng = np.random.default_rng(seed)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in program.inputs}
    plan = plan_program(program, BACKEND.profile(), BACKEND.budget())
    exe = BACKEND.prepare(program, plan, {})
    aliases = {b.name for b in plan.buffers if b.alias_of is not None}
    assert {r.name for n in program.nodes if n.id in exe.aliased for r in n.results} == aliases
    want = interpret(program, inputs, {})
    for _ in range(2):  # the arena is reused between runs
        got = exe.run(inputs)
        assert list(got) == list(want)
        for name in want:
            assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
