"""The CPU executor honours every view of dif.plan.views (strided numpy arrays over the arena), so a
view the planner places wrongly corrupts results here: random programs of last-axis and token-axis
splits and concats over elementwise ops, linears and GLUs must equal the interpreter exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dif.interp import interpret
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.plan.planner import plan_program
from dif_backend_cpu.device import CpuBackend

BACKEND = CpuBackend()


def run_both(program: Program, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    rng = np.random.default_rng(seed)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in program.inputs}
    weights = {p.name: rng.standard_normal(p.type.shape).astype(np.float32) * 0.3 for p in program.params}
    plan = plan_program(program, BACKEND.profile(), BACKEND.budget())
    got = BACKEND.prepare(program, plan, weights).run(inputs)
    pitched = sum(1 for b in plan.buffers if b.pitch_bytes)
    return got, interpret(program, inputs, weights), pitched


@st.composite
def split_concat_programs(draw: st.DrawFn) -> Program:
    batch = draw(st.sampled_from((1, 2, 3)))
    b = ProgramBuilder("views")
    pool: list[Var] = [b.input("x", (batch, 4, 8), "f32")]
    for k in range(draw(st.integers(1, 10))):
        x = draw(st.sampled_from(pool))
        kind = draw(st.sampled_from(("unary", "split", "concat", "linear", "glu", "reshape")))
        width = x.shape[-1]
        if kind == "unary":
            pool.append(b.emit(draw(st.sampled_from(("exp", "neg", "tanh"))), x))
        elif kind == "split" and width >= 8:
            axis = draw(st.sampled_from((1, 2)))
            size = x.shape[axis]
            cut = draw(st.integers(1, size - 1)) if size > 1 else None
            if cut is not None:
                pool += b.emit_multi("split", x, axis=axis, sizes=(cut, size - cut))
        elif kind == "concat":
            others = [v for v in pool if v.shape[:-1] == x.shape[:-1]]
            y = draw(st.sampled_from(others))
            pool.append(b.emit("concat", x, b.emit("neg", y), axis=-1))
        elif kind == "linear":
            out = draw(st.sampled_from((4, 8, 12)))
            pool.append(b.emit("linear", x, b.param(f"w{k}", (out, width), "f32")))
        elif kind == "glu" and width % 2 == 0:
            pool.append(b.emit("glu", x, act="silu", gated_half=draw(st.sampled_from(("first", "second")))))
        elif kind == "reshape" and width % 2 == 0:
            pool.append(b.emit("reshape", x, shape=(*x.shape[:-1], 2, width // 2)))
            pool.append(b.emit("reshape", pool[-1], shape=x.shape))
    b.output(*draw(st.lists(st.sampled_from(pool[1:] or pool), min_size=1, max_size=2, unique_by=lambda v: v.name)))
    return b.build()


@settings(max_examples=120, deadline=None)
@given(split_concat_programs(), st.integers(0, 2**16))
def test_programs_with_views_equal_the_interpreter(program: Program, seed: int) -> None:
    got, want, _ = run_both(program, seed)
    for name, ref in want.items():
        np.testing.assert_array_equal(got[name], ref, err_msg=name)


def test_single_block_with_pitched_views_equals_the_interpreter() -> None:
    b = ProgramBuilder("single_block")
    batch, tokens, d, f, heads = 2, 8, 16, 24, 2
    x = b.input("x", (batch, tokens, d), "f32")
    proj = b.emit("linear", x, b.param("w_in", (3 * d + 2 * f, d), "f32"))
    q, k, v, mlp = b.emit_multi("split", proj, axis=-1, sizes=(d, d, d, 2 * f))
    q, k, v = (b.emit("reshape", t, shape=(batch, tokens, heads, d // heads)) for t in (q, k, v))
    o = b.emit("reshape", b.emit("sdpa", q, k, v), shape=(batch, tokens, d))
    cat = b.emit("concat", o, b.emit("glu", mlp, act="silu", gated_half="first"), axis=-1)
    b.output(b.emit("linear", cat, b.param("w_out", (d, d + f), "f32")))
    got, want, pitched = run_both(b.build(), 7)
    assert pitched >= 6  # q, k, v, mlp as rows of the projection; sdpa and glu outputs as rows of the concat
    for name, ref in want.items():
        np.testing.assert_array_equal(got[name], ref, err_msg=name)
