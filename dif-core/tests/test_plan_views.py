"""Planner views (dif.plan.views): split results and concat operands placed inside another value's bytes,
contiguous or as pitched rows, only as far as the target's capabilities allow; check_plan polices them.
Numbers are checked by the CPU backend, which honours every view (dif-backend-cpu/tests/test_views.py)."""

from __future__ import annotations

import pytest
from attrs import evolve

from dif.errors import PlanError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plan.plan import ALIAS_CAPABILITY, Plan, check_plan
from dif.plan.planner import plan_program
from dif.plan.views import (
    ANY_VIEW_CAPABILITY,
    CONCAT_CAPABILITY,
    SPLIT_CAPABILITY,
    byte_strides,
    part_loc,
    row_axes,
    view_capability,
)
from dif.target import RuntimeBudget, TargetProfile

BIG = RuntimeBudget(free_memory_bytes=1 << 34)
VIEWS = (ALIAS_CAPABILITY, SPLIT_CAPABILITY, CONCAT_CAPABILITY)
GPU_LIKE = (*VIEWS, view_capability("linear", 1), view_capability("glu", 1), view_capability("sdpa", 2))


def profile(*caps: str) -> TargetProfile:
    return TargetProfile(backend="test", device="unit", memory_bytes=1 << 34, capabilities=caps)


def single_block(batch: int = 1, tokens: int = 8, d: int = 16, f: int = 32, heads: int = 2) -> Program:
    """The parallel single-stream block's data flow: one projection split into q, k, v, mlp (last axis),
    attention and a gated MLP whose outputs are concatenated (last axis) into the output projection."""
    b = ProgramBuilder("single_block")
    x = b.input("x", (batch, tokens, d), "f32")
    proj = b.emit("linear", x, b.param("w_in", (3 * d + 2 * f, d), "f32"))  # %0
    q, k, v, mlp = b.emit_multi("split", proj, axis=-1, sizes=(d, d, d, 2 * f))  # %1
    hd = d // heads
    q, k, v = (b.emit("reshape", t, shape=(batch, tokens, heads, hd)) for t in (q, k, v))
    o = b.emit("reshape", b.emit("sdpa", q, k, v), shape=(batch, tokens, d))
    g = b.emit("glu", mlp, act="silu", gated_half="first")
    cat = b.emit("concat", o, g, axis=-1)
    b.output(b.emit("linear", cat, b.param("w_out", (d, d + f), "f32")))
    return b.build()


def producer_op(program: Program, name: str) -> str:
    return program.producers[name].op


def views_by_op(program: Program, plan: Plan) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for b in plan.buffers:
        if b.is_alias:
            out.setdefault(producer_op(program, b.name), []).append((b.row_bytes, b.pitch_bytes))
    return out


def test_part_geometry() -> None:
    # [2, 3, 10] f32, last-axis part 4:7 -> rows of 3 elements every 10, starting 4 elements in
    loc = part_loc("r", (2, 3, 10), 2, 4, 3, 4)
    assert (loc.offset, loc.row, loc.pitch) == (16, 12, 40)
    assert part_loc("r", (1, 6, 10), 1, 2, 4, 4) == part_loc("r", (1, 6, 10), 1, 2, 4, 4)
    token_part = part_loc("r", (1, 6, 10), 1, 2, 4, 4)  # batch 1: whole rows, contiguous
    assert (token_part.offset, token_part.pitched) == (80, False)
    assert row_axes((2, 3, 4, 5), 80, 4) == 2 and row_axes((2, 3, 4, 5), 60, 4) == 0
    assert byte_strides((2, 3, 2, 5), 4, 40, 100) == (300, 100, 20, 4)
    assert byte_strides((2, 3), 2) == (6, 2)


def test_single_block_views_on_a_gpu_like_target() -> None:
    program = single_block()
    plan = plan_program(program, profile(*GPU_LIKE), BIG)
    check_plan(plan, program)
    by_op = views_by_op(program, plan)
    d, f = 16 * 4, 32 * 4
    width = 3 * d + 2 * f
    assert sorted(by_op["split"]) == [(d, width)] * 3 + [(2 * f, width)]  # q, k, v, mlp: rows of the projection
    assert by_op["sdpa"] == [(d, d + f)] and by_op["glu"] == [(f, d + f)]  # written into the concat's rows
    buf = plan.buffer_by_name
    cat = next(n for n in program.nodes if n.op == "concat").results[0].name
    sdpa = next(n for n in program.nodes if n.op == "sdpa").results[0].name
    assert buf[sdpa].alias_of == cat and buf[sdpa].offset == buf[cat].offset
    assert buf[cat].first_use <= buf[sdpa].first_use  # the host lives from its first part's write
    decision = next(d.what for d in plan.decisions if d.what.startswith("views:"))
    assert "4 split (pitched)" in decision and "2 concat operand (pitched)" in decision


def test_pitched_views_need_every_reader_and_writer_declared() -> None:
    program = single_block()
    no_sdpa = plan_program(program, profile(*VIEWS, view_capability("linear", 1), view_capability("glu", 1)), BIG)
    by_op = views_by_op(program, no_sdpa)
    assert by_op["split"] == [(2 * 32 * 4, (3 * 16 + 2 * 32) * 4)]  # only mlp: q, k, v feed sdpa
    assert "sdpa" not in by_op and by_op["glu"]
    only_aliases = plan_program(program, profile(*VIEWS), BIG)
    assert set(views_by_op(program, only_aliases)) == {"reshape"}  # batch 1 but last-axis parts: all pitched
    anything = plan_program(program, profile(*VIEWS, ANY_VIEW_CAPABILITY), BIG)
    assert views_by_op(program, anything).keys() == views_by_op(program, plan_program(
        program, profile(*GPU_LIKE), BIG)).keys()  # fmt: skip


def test_token_axis_parts_of_batch_one_are_contiguous_views_for_any_op() -> None:
    b = ProgramBuilder("tokens")
    x = b.input("x", (1, 8, 4), "f32")
    y = b.input("y", (1, 4, 4), "f32")
    ex = b.emit("exp", x)
    ny = b.emit("neg", y)
    cat = b.emit("concat", ny, ex, axis=1)
    head, tail = b.emit_multi("split", b.emit("tanh", cat), axis=1, sizes=(4, 8))
    b.output(
        b.emit("add", b.emit("sigmoid", head), b.emit("sin", b.emit_multi("split", tail, axis=1, sizes=(4, 4))[0]))
    )
    program = b.build()
    plan = plan_program(program, profile(*VIEWS), BIG)
    check_plan(plan, program)
    buf = plan.buffer_by_name
    assert buf[ny.name].alias_of == cat.name and buf[ex.name].offset == buf[cat.name].offset + 4 * 4 * 4
    assert buf[head.name].alias_of is not None and buf[tail.name].offset == buf[head.name].offset + 64
    assert all(not b.pitch_bytes for b in plan.buffers)
    plain = plan_program(program, profile(ALIAS_CAPABILITY), BIG)
    assert all(not b.is_alias for b in plain.buffers) and plan.arena_bytes < plain.arena_bytes


def test_values_that_cannot_be_moved_keep_their_slots() -> None:
    b = ProgramBuilder("kept")
    x = b.input("x", (1, 4, 4), "f32")
    e = b.emit("exp", x)
    twice = b.emit("concat", e, e, axis=1)  # the same value in two parts
    r = b.emit("reshape", x, shape=(1, 4, 4))  # a reshape of an input copies: not moved (executors skip views)
    other = b.emit("concat", twice, r, axis=1)
    b.output(other, e)  # e is also an output
    program = b.build()
    plan = plan_program(program, profile(*VIEWS), BIG)
    check_plan(plan, program)
    buf = plan.buffer_by_name
    assert buf[e.name].alias_of is None and buf[r.name].alias_of is None
    assert buf[twice.name].alias_of == other.name  # a concat hosting no parts may itself be a part
    misaligned = ProgramBuilder("odd")
    z = misaligned.input("z", (1, 3), "f32")
    parts = misaligned.emit_multi("split", misaligned.emit("exp", z), axis=1, sizes=(1, 2))
    misaligned.output(misaligned.emit("neg", parts[1]))
    odd = misaligned.build()
    odd_plan = plan_program(odd, profile(*VIEWS), BIG)
    assert odd_plan.buffer_by_name[parts[0].name].is_alias  # offset 0
    assert not odd_plan.buffer_by_name[parts[1].name].is_alias  # 4 bytes in: not 16-byte aligned


def with_buffer(plan: Plan, name: str, **changes: object) -> Plan:
    return evolve(plan, buffers=tuple(evolve(b, **changes) if b.name == name else b for b in plan.buffers))


def test_check_plan_rejects_views_their_ops_do_not_make() -> None:
    program = single_block()
    plan = plan_program(program, profile(*GPU_LIKE), BIG)
    buf = plan.buffer_by_name
    split = next(n for n in program.nodes if n.op == "split")
    q, k = split.results[0].name, split.results[1].name
    glu = next(n for n in program.nodes if n.op == "glu").results[0].name
    with pytest.raises(PlanError, match="split node .* does not put it there"):
        check_plan(with_buffer(plan, k, offset=buf[q].offset), program)  # k over q's part
    with pytest.raises(PlanError, match="not at its part of concat node"):
        check_plan(with_buffer(plan, glu, offset=buf[glu].offset - 16), program)
    with pytest.raises(PlanError, match="rows of .* do not describe a view"):
        check_plan(with_buffer(plan, q, row_bytes=buf[q].pitch_bytes + 4), program)
    with pytest.raises(PlanError, match="not inside the root's bytes"):
        check_plan(with_buffer(plan, glu, pitch_bytes=buf[glu].pitch_bytes * 4), program)


def test_backends_refuse_views_their_target_does_not_declare() -> None:
    from dif.plan.views import check_view_capabilities

    program = single_block()
    plan = plan_program(program, profile(*GPU_LIKE), BIG)
    check_view_capabilities(plan, program, GPU_LIKE)
    with pytest.raises(PlanError, match="does not declare 'alias:concat'"):
        check_view_capabilities(plan, program, (ALIAS_CAPABILITY, SPLIT_CAPABILITY, "view:*"))
    with pytest.raises(PlanError, match=r"pitched view \(split\) but the target does not declare .view:<op>:<rows>."):
        check_view_capabilities(plan, program, VIEWS)
