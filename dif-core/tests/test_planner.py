"""Planner v1: schedule, lifetimes, arena packing (unit + property tests on random DAGs), residency."""

from __future__ import annotations

import itertools

import pytest
from attrs import evolve
from hypothesis import given, settings
from hypothesis import strategies as st

from dif.errors import PlanError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Node, Program, Value
from dif.ir.types import TensorType
from dif.plan.plan import ALIGNMENT, RESIDENT, Plan, check_arena, check_plan
from dif.plan.planner import plan_program
from dif.target import RuntimeBudget, TargetProfile

PROFILE = TargetProfile(backend="test", device="unit", arch="x", memory_bytes=1 << 34)
BIG = RuntimeBudget(free_memory_bytes=1 << 34)


def chain(n: int = 5, width: int = 100) -> Program:
    """x -> neg -> neg -> ... (n nodes), one f32[4, width] value each; output is the last."""
    b = ProgramBuilder("chain")
    v = b.input("x", (4, width), "f32")
    for _ in range(n):
        v = b.emit("neg", v)
    b.output(v)
    return b.build()


def assert_no_live_overlap(plan: Plan) -> None:
    """Independent oracle for check_arena: at every step, live byte ranges are disjoint."""
    for step in range(len(plan.schedule)):
        live = sorted((b.offset, b.offset + b.size, b.name) for b in plan.buffers if b.first_use <= step <= b.last_use)
        for (_, end, a), (start, _, b) in itertools.pairwise(live):
            assert end <= start, f"step {step}: {a} and {b} overlap"


def test_chain_reuses_two_slots() -> None:
    program = chain(6)
    plan = plan_program(program, PROFILE, BIG)
    check_plan(plan, program)
    slot = -(-1600 // ALIGNMENT) * ALIGNMENT
    assert plan.schedule == tuple(range(6))
    assert plan.arena_bytes == 2 * slot  # producer and consumer alive together, nothing else
    assert plan.peak_bytes == 2 * slot
    assert len({b.offset for b in plan.buffers}) == 2
    assert all(b.offset % ALIGNMENT == 0 and b.size % ALIGNMENT == 0 for b in plan.buffers)


def test_lifetimes_outputs_inputs_and_dead_values() -> None:
    b = ProgramBuilder("life")
    x = b.input("x", (8,), "f32")
    w = b.param("w", (8,), "f32")
    a = b.emit("exp", x)  # 0: used by 1 and 3
    c = b.emit("mul", a, w)  # 1: output, also used by 2
    b.emit("neg", c)  # 2: dead (no users, not an output)
    d = b.emit("add", a, c)  # 3
    e = b.emit("neg", d)  # 4
    b.output(c, e)
    program = b.build()
    plan = plan_program(program, PROFILE, BIG)
    check_plan(plan, program)
    buf = plan.buffer_by_name
    assert set(buf) == {"%0", "%1", "%2", "%3", "%4"}  # inputs and params are not in the arena
    assert (buf["%0"].first_use, buf["%0"].last_use) == (0, 3)
    assert (buf["%1"].first_use, buf["%1"].last_use) == (1, 4)  # output lives to the end
    assert (buf["%2"].first_use, buf["%2"].last_use) == (2, 2)
    assert plan.residency == {"w": RESIDENT}
    assert plan.param_bytes == 32


def test_multi_result_node_gets_one_buffer_per_result() -> None:
    b = ProgramBuilder("split")
    x = b.input("x", (4, 6), "f32")
    p, q = b.emit_multi("split", x, axis=1, sizes=(2, 4))
    b.output(b.emit("neg", p), q)
    program = b.build()
    plan = plan_program(program, PROFILE, BIG)
    check_plan(plan, program)
    assert plan.buffer_by_name["%0.0"].nbytes == 32 and plan.buffer_by_name["%0.1"].nbytes == 64
    assert plan.buffer_by_name["%0.1"].last_use == 1


def test_decisions_recorded_and_planning_is_deterministic() -> None:
    program = chain(4)
    plan = plan_program(program, PROFILE, BIG, precision="bf16-weights")
    whats = " | ".join(d.what for d in plan.decisions)
    for word in ("schedule", "arena", "residency", "precision"):
        assert word in whats
    assert all(d.why for d in plan.decisions)
    assert plan.precision == "bf16-weights"
    assert plan == plan_program(program, PROFILE, BIG, precision="bf16-weights")
    assert plan.binding.target_fingerprint == PROFILE.fingerprint()
    assert plan.binding.budget_class == BIG.budget_class
    assert plan.binding.min_memory_bytes == plan.arena_bytes + plan.resident_bytes + plan.staging_bytes


def blocks_program() -> Program:
    """Nine weight blocks: blk0 holds 2 KiB, blk1..blk8 1 KiB each (f32 weights)."""
    b = ProgramBuilder("blocks")
    v = b.input("x", (16,), "f32")
    for i, n in enumerate((512, *([256] * 8))):
        with b.scope(block=f"blk{i}"):
            w = b.param(f"w{i}", (n,), "f32")
            s = b.emit("reduce_sum", w, axes=(0,), keepdims=True)
            v = b.emit("add", v, s)
    b.output(v)
    return b.build()


def test_streams_the_fewest_bytes_that_fit() -> None:
    program = blocks_program()
    arena = plan_program(program, PROFILE, BIG).arena_bytes
    # All resident: arena + 10240. Streaming blk0 (2 KiB) would fix staging at 2 x 2 KiB and need blk0..blk3
    # streamed (5 KiB per forward) to fit arena + 9216; streaming only 1 KiB blocks stages 2 x 1 KiB and
    # needs three of them (3 KiB): resident 7168 + staging 2048 = 9216.
    budget = RuntimeBudget(free_memory_bytes=arena + 9216)
    plan = plan_program(program, PROFILE, budget)
    assert plan.streamed == ("w1", "w2", "w3")
    assert plan.staging_bytes == 2048 and plan.resident_bytes == 7168
    assert plan.binding.min_memory_bytes == arena + 9216
    why = next(d.why for d in plan.decisions if d.what.startswith("residency"))
    assert "streamed 3 of 9 weight blocks (3072 B per forward" in why and f"= {arena + 9216} B <= available" in why
    assert plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=arena + 10240)).streamed == ()


def test_an_outsized_block_stays_resident_while_the_rest_can_stream() -> None:
    program = blocks_program()
    arena = plan_program(program, PROFILE, BIG).arena_bytes
    # arena + 4096: every 1 KiB block streamed (8 KiB) with blk0 resident (2048 + staging 2048) moves less
    # than streaming all nine (10 KiB, staging 4096)
    plan = plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=arena + 4096))
    assert plan.streamed == tuple(f"w{i}" for i in range(1, 9))
    assert plan.resident_bytes == 2048 and plan.staging_bytes == 2048


def test_plan_error_when_nothing_fits() -> None:
    with pytest.raises(PlanError, match="does not fit"):
        plan_program(blocks_program(), PROFILE, RuntimeBudget(free_memory_bytes=1024))


def test_workspace_is_subtracted_from_free_memory() -> None:
    program = chain(3)
    need = plan_program(program, PROFILE, BIG).binding.min_memory_bytes
    plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=need))
    with pytest.raises(PlanError):
        plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=need, workspace_bytes=1))


def test_check_arena_rejects_overlap_misalignment_and_bad_peak() -> None:
    program = chain(4)
    plan = plan_program(program, PROFILE, BIG)
    check_arena(plan)
    stacked = evolve(plan, buffers=tuple(evolve(b, offset=0) for b in plan.buffers))
    with pytest.raises(PlanError, match="overlap"):
        check_arena(stacked)
    shifted = evolve(plan, buffers=(evolve(plan.buffers[0], offset=plan.buffers[0].offset + 8), *plan.buffers[1:]))
    with pytest.raises(PlanError, match="multiple of 256"):
        check_arena(shifted)
    with pytest.raises(PlanError, match="past the arena"):
        check_arena(evolve(plan, arena_bytes=plan.arena_bytes - ALIGNMENT))
    with pytest.raises(PlanError, match="peak"):
        check_arena(evolve(plan, peak_bytes=plan.peak_bytes + 1))


def test_check_plan_rejects_short_lifetime_and_wrong_program() -> None:
    program = chain(4)
    plan = plan_program(program, PROFILE, BIG)
    short = evolve(plan.buffers[0], last_use=plan.buffers[0].first_use)
    with pytest.raises(PlanError, match="does not cover"):
        check_plan(evolve(plan, buffers=(short, *plan.buffers[1:])), program)
    with pytest.raises(PlanError, match="schedule"):
        check_plan(plan, chain(5))
    with pytest.raises(PlanError, match="producer"):
        check_plan(evolve(plan, schedule=tuple(reversed(plan.schedule))), program)


# -- property test: random DAGs (built directly; the planner reads only structure and types) --------

SIZES = (1, 7, 64, 65, 300, 1024)


@st.composite
def random_dags(draw: st.DrawFn) -> Program:
    def tensor() -> TensorType:
        return TensorType((draw(st.sampled_from(SIZES)),), draw(st.sampled_from(("f32", "bf16", "u8"))))

    inputs = [Value(f"in{i}", tensor()) for i in range(draw(st.integers(1, 3)))]
    params = [Value(f"p{i}", tensor()) for i in range(draw(st.integers(0, 2)))]
    names = [v.name for v in (*inputs, *params)]
    nodes = []
    for k in range(draw(st.integers(1, 30))):
        operands = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3))
        count = draw(st.sampled_from((1, 1, 1, 2)))
        results = [Value(f"%{k}" if count == 1 else f"%{k}.{j}", tensor()) for j in range(count)]
        nodes.append(Node(k, "any", operands, results))
        names += [r.name for r in results]
    results_all = [r.name for n in nodes for r in n.results]
    outputs = draw(st.lists(st.sampled_from(results_all), min_size=1, max_size=4, unique=True))
    return Program("dag", inputs, params, nodes, outputs)


@settings(max_examples=150, deadline=None)
@given(random_dags())
def test_random_dags_pack_without_live_overlap(program: Program) -> None:
    plan = plan_program(program, PROFILE, BIG)
    check_plan(plan, program)
    assert_no_live_overlap(plan)
    assert plan.peak_bytes <= plan.arena_bytes <= sum(b.size for b in plan.buffers)
    end = len(plan.schedule) - 1
    assert all(plan.buffer_by_name[o].last_use == end for o in program.outputs)
