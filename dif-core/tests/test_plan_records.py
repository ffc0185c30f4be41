"""What the plan records for its backends: the weight-streaming schedule (blocks, slot offsets, slots,
first use, slot reuse) and each node's host/device placement, and the checks that refuse unsound
hand-edited records (`dif.plan.streaming`, `dif.plan.placement`)."""

from __future__ import annotations

from typing import Any

import pytest
from attrs import evolve
from hypothesis import given, settings
from hypothesis import strategies as st

from dif.errors import PlanError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plan.placement import DEVICE, HOST
from dif.plan.plan import RESIDENT, STREAMED, Plan, check_plan
from dif.plan.planner import _streaming_decisions, plan_program, restream, weight_blocks
from dif.plan.streaming import NO_STREAMING, check_streaming
from dif.target import RuntimeBudget, TargetProfile

from .test_planner import BIG, PROFILE, blocks_program, random_dags


def arena_of(program: Program) -> int:
    return plan_program(program, PROFILE, BIG).arena_bytes


# -- streaming ---------------------------------------------------------------------------------------


def test_all_resident_records_no_streaming() -> None:
    plan = plan_program(blocks_program(), PROFILE, BIG)
    assert plan.streaming == NO_STREAMING and plan.staging_bytes == 0
    assert not any(d.what.startswith("streaming") for d in plan.decisions)


def test_the_plan_records_blocks_offsets_slots_and_uses() -> None:
    program = blocks_program()  # blk{i}: w{i} read by node 2i (reduce_sum), blk0 2 KiB, the rest 1 KiB
    plan = plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=arena_of(program) + 9216))
    s = plan.streaming
    assert [b.key for b in s.blocks] == ["block blk1", "block blk2", "block blk3"]
    assert [b.params for b in s.blocks] == [("w1",), ("w2",), ("w3",)]
    assert [b.offsets for b in s.blocks] == [(0,)] * 3 and [b.nbytes for b in s.blocks] == [1024] * 3
    assert [(b.first_use, b.last_use) for b in s.blocks] == [(2, 2), (4, 4), (6, 6)]
    # double buffered: the first two blocks open a slot each, the third takes the one released first
    assert [b.slot for b in s.blocks] == [0, 1, 0] and [b.after for b in s.blocks] == [-1, -1, 0]
    assert (s.slots, s.slot_bytes, s.staging_bytes) == (2, 1024, 2048) == (2, 1024, plan.staging_bytes)
    assert s.offsets() == {"w1": 0, "w2": 1024, "w3": 0}
    what = [d.what for d in plan.decisions]
    assert "streaming: 3 blocks through 2 staging slots of 1024 B" in what


def test_parameters_of_one_block_lie_back_to_back_on_aligned_offsets() -> None:
    b = ProgramBuilder("pair")
    v = b.input("x", (16,), "f32")
    for i in range(4):
        with b.scope(block=f"blk{i}"):
            w = b.param(f"w{i}", (100,), "f32")  # 400 B -> a 512-byte step
            u = b.param(f"u{i}", (16,), "f32")
            v = b.emit("add", b.emit("add", v, u), b.emit("reduce_sum", w, axes=(0,), keepdims=True))
    b.output(v)
    program = b.build()
    plan = plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=arena_of(program) + 2 * 768))
    first = plan.streaming.blocks[0]
    assert first.params == ("w0", "u0") and first.offsets == (0, 512) and first.nbytes == 768
    check_plan(plan, program)


def overlapping() -> Program:
    """Three blocks each read again at the end: at blk2's first read blk0 and blk1 still hold their slots."""
    b = ProgramBuilder("overlapping")
    v = b.input("x", (16,), "f32")
    ws = [b.param(f"w{i}", (256,), "f32") for i in range(3)]
    for i, w in enumerate(ws):
        with b.scope(block=f"blk{i}"):
            v = b.emit("add", v, b.emit("reduce_sum", w, axes=(0,), keepdims=True))
    for w in ws:
        v = b.emit("add", v, b.emit("reduce_max", w, axes=(0,), keepdims=True))
    b.output(v)
    return b.build()


def test_blocks_in_use_together_get_a_slot_each_and_must_fit() -> None:
    program = overlapping()
    plan = restream(plan_program(program, PROFILE, BIG), program, [(f"blk{i}", [f"w{i}"]) for i in range(3)])
    assert [b.slot for b in plan.streaming.blocks] == [0, 1, 2] and plan.staging_bytes == 3 * 1024
    # the admission estimate (2 slots) lets everything stream, the layout needs a third slot
    with pytest.raises(PlanError, match="read out of order and need 3 staging slots"):
        plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=arena_of(program) + 2048))
    (decision,) = _streaming_decisions(program, plan.streaming, plan.arena_bytes, BIG)
    assert decision.what == "streaming: 3 blocks through 3 staging slots of 1024 B"
    assert "need 3 slots, not the 2 the admission assumed: staging 3072 B" in decision.why


def test_unread_and_output_parameters_are_never_streamed() -> None:
    b = ProgramBuilder("odd-params")
    x = b.input("x", (64,), "f32")
    w = b.param("w", (64,), "f32")
    b.param("unused", (64,), "f32")
    v = b.param("v", (64,), "f32")
    with b.scope(block="blk0"):
        y = b.emit("add", x, w)
    with b.scope(block="blk1"):
        z = b.emit("add", y, v)
    b.output(z, w)
    program = b.build()
    assert weight_blocks(program) == {"block blk1": ["v"]}
    plan = plan_program(program, PROFILE, BIG)
    with pytest.raises(PlanError, match="'unused'.*cannot stream"):
        restream(plan, program, [("blk", ["unused"])])
    with pytest.raises(PlanError, match="'w'.*cannot stream"):
        restream(plan, program, [("blk", ["w"])])


def test_hand_edited_streaming_is_refused() -> None:
    program = blocks_program()
    plan = plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=arena_of(program) + 9216))
    s = plan.streaming
    blocks = list(s.blocks)

    def edited(i: int, **changes: Any) -> Plan:
        new = [*blocks]
        new[i] = evolve(blocks[i], **changes)
        return evolve(plan, streaming=evolve(s, blocks=tuple(new)))

    cases = [
        (edited(2, after=-1), "previous tenant is block 0"),
        (edited(1, offsets=(8,)), "increasing multiples of 256"),
        (edited(0, nbytes=4096), "does not fit"),
        (edited(0, slot=2), "not one of the 2 staging slots"),
        (edited(0, first_use=5), "first-use order"),
        (edited(1, params=("w1",)), "in another block too"),
        (evolve(plan, residency={**plan.residency, "w1": RESIDENT}), "residency marks 2 streamed"),
        (evolve(plan, staging_bytes=1024), "is not 2 slots"),
    ]
    for bad, message in cases:
        with pytest.raises(PlanError, match=message):
            check_streaming(bad)
    late = evolve(plan, streaming=evolve(s, blocks=(blocks[0], evolve(blocks[1], first_use=5, last_use=5), blocks[2])))
    with pytest.raises(PlanError, match=r"'w2'.*read at steps 4..4, outside its block's 5..5"):
        check_plan(late, program)
    crowded = evolve(
        plan, streaming=evolve(s, blocks=(blocks[0], evolve(blocks[1], last_use=6), evolve(blocks[2], slot=1, after=1)))
    )
    with pytest.raises(PlanError, match="takes over slot 1 at step 6 while 'block blk2' is still read"):
        check_streaming(crowded)


# -- placement ------------------------------------------------------------------------------------------

HOSTING = evolve(PROFILE, host_threshold_bytes=1024)


def placed() -> Program:
    """Node 0 tiny on inputs and weights, 1 tiny on 0, 2 big, 3 tiny but reading 2, 4 tiny on 1."""
    b = ProgramBuilder("placed")
    x = b.input("x", (8,), "f32")
    w = b.param("w", (8,), "f32")
    big = b.input("big", (1024,), "f32")
    a = b.emit("mul", x, w)
    c = b.emit("neg", a)
    d = b.emit("exp", big)
    e = b.emit("reduce_sum", d, axes=(0,), keepdims=True)
    b.output(b.emit("add", c, x), e)
    return b.build()


def test_no_threshold_places_every_node_on_the_device() -> None:
    plan = plan_program(placed(), PROFILE, BIG)
    assert plan.placement == (DEVICE,) * 5 and plan.host_nodes == ()
    why = next(d.why for d in plan.decisions if d.what.startswith("placement"))
    assert "declares no host_threshold_bytes" in why


def test_tiny_host_known_nodes_go_to_the_host_with_their_reason() -> None:
    program = placed()
    plan = plan_program(program, HOSTING, BIG)
    assert plan.placement == (HOST, HOST, DEVICE, DEVICE, HOST)
    assert plan.host_nodes == (0, 1, 4)
    decisions = {d.what: d.why for d in plan.decisions}
    assert "placement: 3 of 5 nodes on the host, 2 on the device" in decisions
    assert decisions["placement: node 0 (mul) on the host"] == (
        "touches 96 B <= 1024 B and reads only inputs, weights and host results"
    )
    assert "placement: node 3 (reduce_sum) on the host" not in decisions  # tiny, but reads a device value
    assert plan.binding.target_profile.host_threshold_bytes == 1024
    assert plan.binding.target_fingerprint != plan_program(program, PROFILE, BIG).binding.target_fingerprint


def test_hand_edited_placement_is_checked() -> None:
    program = placed()
    plan = plan_program(program, HOSTING, BIG)
    check_plan(evolve(plan, placement=(DEVICE,) * 5), program)  # moving nodes to the device is always fine
    check_plan(evolve(plan, placement=(HOST, HOST, HOST, HOST, HOST)), program)  # big, but host-known
    with pytest.raises(PlanError, match=r"node 1 \(neg\) is placed on the host but reads %0"):
        check_plan(evolve(plan, placement=(DEVICE, HOST, DEVICE, DEVICE, HOST)), program)
    with pytest.raises(PlanError, match="placement lists 4 nodes"):
        check_plan(evolve(plan, placement=(HOST,) * 4), program)
    with pytest.raises(PlanError, match="unknown node placement"):
        check_plan(evolve(plan, placement=("gpu",) * 5), program)


# -- property: random programs, budgets and thresholds plan into records that check -----------------------


@settings(max_examples=100, deadline=None)
@given(random_dags(), st.integers(0, 4096), st.sampled_from((None, 64, 1024)))
def test_random_plans_record_sound_streaming_and_placement(program: Program, spare: int, threshold: int | None) -> None:
    profile = TargetProfile(backend="test", device="unit", host_threshold_bytes=threshold)
    arena = plan_program(program, profile, BIG).arena_bytes
    try:
        plan = plan_program(program, profile, RuntimeBudget(free_memory_bytes=arena + spare))
    except PlanError as exc:
        assert "does not fit" in str(exc)
        return
    check_plan(plan, program)
    assert plan.binding.min_memory_bytes <= arena + spare
    assert set(plan.streaming.streamed) == {n for n, r in plan.residency.items() if r == STREAMED}
    assert len(plan.placement) == len(plan.schedule)
